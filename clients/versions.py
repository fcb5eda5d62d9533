"""The versions a client checks: the Ray it runs on, and the placectl its controller runs."""

from __future__ import annotations

import sys

from controller import PlacementError, version

# Ray before 2.60 kills, at its first task, a process whose visible devices are set from
# its runtime environment and are fewer than the node's (an IndexError in Ray's
# get_accelerator_ids): every placectl process that holds several accelerators.
# scripts/tools/check_ray.py shows it.
MIN_RAY = (2, 60)


def check_ray_version(ray_version: str) -> None:
    """Raise PlacementError if ``ray_version`` is older than placectl needs."""
    try:
        found = tuple(int(p) for p in ray_version.split(".")[:2])
    except ValueError:
        return  # a development build: nothing to compare
    if found < MIN_RAY:
        raise PlacementError(
            f"placectl needs Ray >= {MIN_RAY[0]}.{MIN_RAY[1]}, this is Ray {ray_version}: "
            'pip install "ray[default]>=2.60"'
        )


def warn_if_versions_differ(theirs: str) -> None:
    """Say on stderr when the controller runs another placectl than this client: the
    table format is versioned and a newer one is refused, but behaviour may differ."""
    ours = version()
    if theirs != ours:
        print(
            f"placectl: warning: the controller runs placectl {theirs}, this client "
            f"{ours}; upgrade one of them (see the upgrade guide)",
            file=sys.stderr,
            flush=True,
        )
