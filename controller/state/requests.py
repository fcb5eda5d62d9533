"""Checks on what callers send the controller: job names, timeouts, specs, policies.

Every check raises a :class:`ReservationError` (a PlacementError) whose one-line message
quotes the value and says what is allowed; the controller's state is never touched
before they pass.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from controller.errors import ReservationError
from controller.planning.spec import ClusterSpec, load_spec
from controller.state.records import AUTO, MANUAL

_JOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
MAX_TIMEOUT_S = 86_400.0


def check_job(job: object) -> str:
    """Return ``job`` if it is a valid job name, else raise ReservationError."""
    if not isinstance(job, str) or not _JOB.match(job):
        raise ReservationError(
            f"job name {job!r}: use 1-128 letters, digits, '_', '.', '-', starting with a "
            "letter or digit"
        )
    return job


def coerce_spec(spec: Any) -> ClusterSpec:
    """A spec sent to the controller, validated: anything load_spec takes, or a ClusterSpec."""
    if isinstance(spec, ClusterSpec):
        # Re-validate the types of a record that came over the wire.
        try:
            return msgspec.convert(msgspec.to_builtins(spec), ClusterSpec)
        except (msgspec.ValidationError, TypeError) as e:
            raise ReservationError(f"malformed ClusterSpec: {e}") from None
    return load_spec(spec)


def check_timeout(timeout_s: Any, what: str = "timeout_s") -> float:
    """A timeout in seconds, checked to be a number in (0, MAX_TIMEOUT_S]."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise ReservationError(f"{what} {timeout_s!r}: expected a number of seconds")
    if math.isnan(timeout_s) or not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ReservationError(f"{what} {timeout_s}: must be in (0, {MAX_TIMEOUT_S:g}]")
    return float(timeout_s)


def check_policy(repair: object) -> str:
    """A repair policy: ``auto`` or ``manual``."""
    if repair not in (AUTO, MANUAL):
        raise ReservationError(f"repair {repair!r}: expected 'auto' or 'manual'")
    return str(repair)


def check_flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ReservationError(f"{what} {value!r}: expected True or False")
    return value


_QUEUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
MAX_PRIORITY = 1_000_000


def check_queue(queue: object, allow_empty: bool = True) -> str:
    """A queue name: 1-64 letters, digits, '_', '.', '-' (``""``: no queue, if allowed)."""
    if queue in ("", None) and allow_empty:
        return ""
    if not isinstance(queue, str) or not _QUEUE.match(queue):
        raise ReservationError(
            f"queue {queue!r}: use 1-64 letters, digits, '_', '.', '-', starting with a "
            "letter or digit"
        )
    return queue


def check_priority(priority: object) -> int:
    """A priority: an int in [-MAX_PRIORITY, MAX_PRIORITY]; higher is admitted first."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ReservationError(f"priority {priority!r}: expected an int (higher goes first)")
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise ReservationError(f"priority {priority}: must be in [{-MAX_PRIORITY}, {MAX_PRIORITY}]")
    return priority


def check_quota(limits: object) -> dict[str, float]:
    """A quota: resource name -> a number >= 0 (``{}`` removes the quota)."""
    if not isinstance(limits, dict):
        raise ReservationError(f"quota {limits!r}: expected a mapping of resource to limit")
    out = {}
    for k, v in limits.items():
        if not isinstance(k, str) or not k or len(k) > 128:
            raise ReservationError(f"quota resource {k!r}: expected a resource name (GPU, ...)")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v < 0:
            raise ReservationError(f"quota {k}={v!r}: expected a number >= 0")
        out[k] = float(v)
    return out


def check_token(token: object) -> str:
    """An owner token: a string of at most 256 characters ("" for none)."""
    if not isinstance(token, str) or len(token) > 256:
        raise ReservationError("token: expected a string of at most 256 characters")
    return token
