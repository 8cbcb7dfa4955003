"""Configuration: the TOML file, its validation, sizes and durations, certificates."""
