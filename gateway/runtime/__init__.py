"""The running gateway: listeners, connections, upstreams, plugins, drain."""
