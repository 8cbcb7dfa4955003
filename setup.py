"""The one thing pyproject.toml cannot say: the optional C speedups.

``protocols/micromessage/_speedups.c`` scans and frames Micromessage2's MESSAGE
frames in C (about ten times faster than the same loops in Python, which
``frames.py`` keeps and uses when the module is missing). It needs a C compiler
and Python's headers (Debian: ``gcc python3-dev``); without them the build says
so and goes on without the module (``optional=True``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "protocols.micromessage._speedups",
            ["protocols/micromessage/_speedups.c"],
            optional=True,
        )
    ]
)
