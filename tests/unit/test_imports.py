"""Every module of placectl imports: a name that moved (as ``live_view`` once did, and
``placectl plan`` then failed on any running cluster) is caught here, not by a user."""

from __future__ import annotations

import importlib
import pathlib
import pkgutil

import pytest

from controller import PlacementError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def modules() -> list[str]:
    out = []
    for package in ("controller", "clients"):
        root = importlib.import_module(package)
        out.append(package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            out.append(info.name)
    return sorted(out)


@pytest.mark.parametrize("name", modules())
def test_the_module_imports(name):
    try:
        importlib.import_module(name)
    except PlacementError as e:
        # A framework integration needs its framework; without it, it says which.
        assert name.startswith("clients.integrations.") and "needs" in str(e), e


def test_every_module_is_found():
    found = set(modules())
    files = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for package in ("controller", "clients")
        for p in (ROOT / package).rglob("*.py")
    }
    assert files <= found, sorted(files - found)
