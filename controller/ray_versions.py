"""The Ray releases placectl runs on, and what each can do that placectl uses.

placectl runs on every Ray from :data:`FLOOR` (2.48, what the oldest pin among the RL
frameworks asks for) to the newest. Where it relies on something a later Ray brought, the
:class:`Feature` below names it and the lowest release that has it; the code that uses it
asks :func:`has` where it is used, does the older Ray's equivalent where there is one, and
otherwise refuses with :func:`refusal`'s one line (docs/reference/ray-versions.md is the
table for users). Nothing here imports Ray: the installed release is read from the
package's metadata (:func:`installed`), so the planning core and the unit tests stay
Ray-free, and the fake cluster can claim any release.
"""

from __future__ import annotations

import functools
import re
from importlib import metadata
from typing import NamedTuple

FLOOR = (2, 48)


class Feature(NamedTuple):
    """Something of Ray's that placectl uses: in words, and the first release with it."""

    what: str
    since: tuple[int, int]


# A placement group's bundles placed on the node their label selector names
# (``bundle_label_selector=[{"ray.io/node-id": ...}]``). Ray 2.48 accepts the argument and
# ignores it when it schedules the group (its node label is ``ray.io/node_id``, too):
# placectl pins by the node's own ``node:<ip>`` resource there.
PIN_BY_LABEL = Feature("placement-group bundles pinned by label selector", (2, 49))
# Selectors with operators (``!in(...)``): how placectl's demand keeps off the nodes it
# must not count, so the autoscaler adds one.
DEMAND_SELECTORS = Feature("asking the autoscaler for nodes (label selectors on bundles)", (2, 49))
# A process whose visible devices are set from its runtime environment and are fewer
# than its node's: Ray before 2.60 maps its device slots through that list and fails
# with an IndexError at its first task. placectl sets them at the process's start there
# (clients.process_start).
NARROW_DEVICES = Feature("visible devices set from a process's runtime environment", (2, 60))
TOKEN_AUTH = Feature("token authentication (RAY_AUTH_MODE=token)", (2, 52))
ROCKSDB_STORE = Feature("the GCS's embedded RocksDB store (RAY_gcs_storage=rocksdb)", (2, 57))

FEATURES = (PIN_BY_LABEL, DEMAND_SELECTORS, TOKEN_AUTH, ROCKSDB_STORE, NARROW_DEVICES)


def release(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a Ray version string; None for one that does not parse."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def has(feature: Feature, version: str) -> bool:
    """Whether Ray ``version`` has ``feature``. A version that does not parse (a
    development build) is taken to have everything."""
    found = release(version)
    return found is None or found >= feature.since


def install_hint(since: tuple[int, int]) -> str:
    return f'pip install "ray[default]>={since[0]}.{since[1]}"'


def refusal(feature: Feature, version: str) -> str:
    """The one line that refuses ``feature`` on Ray ``version``."""
    s = feature.since
    return (
        f"{feature.what} needs Ray >= {s[0]}.{s[1]}; this cluster runs Ray {version} "
        f"(upgrade every node: {install_hint(s)})"
    )


def too_old(version: str) -> str | None:
    """Why placectl cannot run on Ray ``version`` at all, or None."""
    found = release(version)
    if found is None or found >= FLOOR:
        return None
    return f"placectl needs Ray >= {FLOOR[0]}.{FLOOR[1]}, this is Ray {version}: " + install_hint(
        FLOOR
    )


@functools.cache
def installed() -> str:
    """The Ray release installed beside this process ("" if none is): the one every Ray
    call of this process goes to, since Ray refuses a driver of another release."""
    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return ""
