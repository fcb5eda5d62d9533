"""How two configurations differ, in a few words for error messages."""

from __future__ import annotations

from typing import Any

import msgspec

from controller.planning.spec import ClusterSpec


def describe_difference(old: ClusterSpec, new: ClusterSpec) -> str:
    """A short account of how two specs differ, e.g. ``components[actor].placement: ...``."""
    diffs: list[str] = []

    def short(v: Any) -> str:
        text = repr(v)
        return text if len(text) <= 40 else text[:37] + "..."

    def keyed(items: list) -> dict | None:
        if not all(isinstance(x, dict) and (x.get("name") or x.get("label")) for x in items):
            return None
        return {x.get("name") or x.get("label"): x for x in items}

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, list) and isinstance(b, list):
            ka, kb = keyed(a), keyed(b)
            if ka is not None and kb is not None:
                a, b = ka, kb
            elif len(a) == len(b):
                a, b = dict(enumerate(a)), dict(enumerate(b))
        if isinstance(a, dict) and isinstance(b, dict):
            for k in [*a, *(k for k in b if k not in a)]:
                where = f"{path}[{k}]" if isinstance(k, int) or path.endswith("s") else k
                where = f"{path}.{k}" if path and not where.startswith(path) else where
                if k not in b:
                    diffs.append(f"{where} removed")
                elif k not in a:
                    diffs.append(f"{where} added")
                else:
                    walk(a[k], b[k], where)
        elif a != b:
            diffs.append(f"{path}: {short(a)} -> {short(b)}")

    walk(msgspec.to_builtins(old), msgspec.to_builtins(new), "")
    return "; ".join(diffs[:4]) + ("; ..." if len(diffs) > 4 else "") if diffs else "no difference"
