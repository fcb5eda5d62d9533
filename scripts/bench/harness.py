"""What every benchmark shares: its command line, the local cluster it runs on, and its
result, printed as it goes and written as JSON (``--json PATH``) for comparing runs.

A result is a list of measures, each with its samples; a measure may name the baseline
it was measured beside, in the same run (the ratio is then part of the result).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

from clients.testing.local import local_cluster

__all__ = ["Results", "local_cluster", "median", "parser", "percentile"]


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The benchmark's command line: its own options, and ``--json PATH``."""
    ap = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0])
    ap.add_argument("--json", metavar="PATH", help="also write the result here, as JSON")
    return ap


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def percentile(samples: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100), nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


class Results:
    """The measures of one run of one benchmark."""

    def __init__(self, bench: str, args: argparse.Namespace | None = None) -> None:
        self.bench = bench
        self.args = {k: v for k, v in vars(args or argparse.Namespace()).items() if k != "json"}
        self._path = getattr(args, "json", None)
        self.started = time.time()
        self.measures: list[dict[str, Any]] = []

    def add(
        self,
        name: str,
        samples: list[float],
        unit: str = "s",
        baseline: str | None = None,
        **facts: Any,
    ) -> dict[str, Any]:
        """Record ``samples`` of ``name`` (beside the measure ``baseline``, if given, whose
        median the ratio divides by); returns the measure."""
        samples = [float(x) for x in samples]
        measure: dict[str, Any] = {
            "name": name,
            "unit": unit,
            "samples": samples,
            "median": median(samples) if samples else None,
            "p99": percentile(samples, 99) if samples else None,
            "max": max(samples) if samples else None,
            **facts,
        }
        if baseline is not None:
            base = self.get(baseline)
            measure["baseline"] = baseline
            if base["median"] and measure["median"] is not None:
                measure["ratio"] = measure["median"] / base["median"]
        self.measures.append(measure)
        return measure

    def get(self, name: str) -> dict[str, Any]:
        for measure in self.measures:
            if measure["name"] == name:
                return measure
        raise KeyError(f"no measure {name!r} in {self.bench} (has {self.names()})")

    def names(self) -> list[str]:
        return [m["name"] for m in self.measures]

    def document(self) -> dict[str, Any]:
        import ray

        from controller import version

        return {
            "bench": self.bench,
            "args": self.args,
            "started": self.started,
            "seconds": time.time() - self.started,
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(),
                "ray": ray.__version__,
                "placectl": version(),
            },
            "measures": self.measures,
        }

    def write(self) -> None:
        """Write the result to ``--json`` if it was given (else nothing)."""
        if self._path:
            with open(self._path, "w") as f:
                json.dump(self.document(), f, indent=1)
            print(f"result written to {self._path}", file=sys.stderr)
