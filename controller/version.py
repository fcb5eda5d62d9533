"""placectl's version: the installed package's, else this source tree's."""

from __future__ import annotations

from importlib import metadata

SOURCE_VERSION = "0.1.0"  # pyproject.toml's [project] version; a test keeps them equal


def version() -> str:
    """The version of the placectl this process runs."""
    try:
        return metadata.version("placectl")
    except metadata.PackageNotFoundError:
        return SOURCE_VERSION
