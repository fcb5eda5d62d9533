"""The versions a client checks: the Ray it runs on, and the placectl its controller runs."""

from __future__ import annotations

import sys
from collections.abc import Mapping

from controller import PlacementError, version
from controller.ray_versions import FLOOR, TOKEN_AUTH, has, refusal, too_old

# The lowest Ray placectl runs on (what each release can do: controller.ray_versions).
MIN_RAY = FLOOR


def check_ray_version(ray_version: str) -> None:
    """Raise PlacementError if ``ray_version`` is older than placectl runs on; the
    message names the floor and the install command."""
    why = too_old(ray_version)
    if why is not None:
        raise PlacementError(why)


def check_ray_features(env: Mapping[str, str], ray_version: str) -> None:
    """Raise PlacementError if ``env`` asks Ray for something Ray ``ray_version`` does not
    have and would ignore without a word: token authentication before Ray 2.52 (a
    cluster the user believes secured would not be)."""
    if env.get("RAY_AUTH_MODE", "").lower() == "token" and not has(TOKEN_AUTH, ray_version):
        raise PlacementError(refusal(TOKEN_AUTH, ray_version))


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
