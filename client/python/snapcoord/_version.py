"""The package's version: its one source. The build backend
(_build/snapcoord_build.py) reads it from here for the wheel's metadata, as
pyproject.toml declares the version dynamic."""

__version__ = "0.1.0"
