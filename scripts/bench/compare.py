#!/usr/bin/env python3
"""Two sets of benchmark results side by side, from their JSON (``--json``): for each
measure, the median of every sample of the runs in A and in B, and B / A.

Runs of one benchmark, alternated on one machine (A, B, A, B, ...), compare two versions
of the code without either getting the quieter minutes.

Usage: scripts/bench/compare.py A1.json [A2.json ...] --against B1.json [B2.json ...]
       [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import json
import statistics


def pooled(paths: list[str]) -> dict[str, tuple[str, list[float]]]:
    """Every sample of every measure across ``paths``, by measure name."""
    out: dict[str, tuple[str, list[float]]] = {}
    for path in paths:
        with open(path) as f:
            for m in json.load(f)["measures"]:
                out.setdefault(m["name"], (m["unit"], []))[1].extend(m["samples"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", nargs="+", help="results of A (the baseline)")
    ap.add_argument("--against", nargs="+", required=True, help="results of B")
    ap.add_argument("--only", default="", help="measures whose name contains this")
    args = ap.parse_args()
    a, b = pooled(args.a), pooled(args.against)
    print(f"{'measure':<28} {'unit':<6} {'A median':>10} {'B median':>10} {'B / A':>7}  samples")
    for name, (unit, xs) in a.items():
        if args.only not in name or name not in b:
            continue
        ys = b[name][1]
        ma, mb = statistics.median(xs), statistics.median(ys)
        scale = 1000 if unit == "s" else 1
        shown = "ms" if unit == "s" else unit
        ratio = f"{mb / ma:7.2f}" if ma else "      -"
        print(
            f"{name:<28} {shown:<6} {ma * scale:>10.2f} {mb * scale:>10.2f} {ratio}  "
            f"{len(xs)}/{len(ys)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
