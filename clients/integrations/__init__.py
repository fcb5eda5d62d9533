"""Adapters that run the frameworks users already have on placectl. Each one is imported
only when used; the frameworks are not dependencies of placectl."""

from __future__ import annotations

import warnings

from controller.errors import PlacementError

RLINF_VERSION = "0.3.0"


def rlinf_missing(error: ImportError) -> PlacementError:
    """What the RLinf modules raise without rlinf: the error, and how to install it."""
    return PlacementError(
        f"the RLinf integration needs rlinf (written against {RLINF_VERSION}): "
        f"pip install --no-deps rlinf=={RLINF_VERSION} omegaconf ({error})"
    )


def warn_if_not(package: str, written_against: str, integration: str) -> None:
    """Warn once, at import, when the installed ``package`` is not the version the
    ``integration`` module was written against (its docstring lists what it relies on)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version(package)
    except PackageNotFoundError:  # a source checkout
        found = "unknown"
    if found != written_against:
        warnings.warn(
            f"placectl's {integration} integration was written against {package} "
            f"{written_against}, this is {found}; see the module docstring for what it "
            "relies on",
            stacklevel=3,
        )
