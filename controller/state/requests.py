"""What callers send the controller: one request type per call, and the checks on its
fields (job names, timeouts, specs, policies, queues, tokens).

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


# ---------------------------------------------------------------- the driver calls
# One type per call the controller answers: its parameters are named here once. The
# client builds it by keyword, Ray carries it (unpickling runs the checks again, on the
# controller), and the controller's facade builds it from the arguments of a call made
# positionally or by keyword. Each type checks its fields when built.


class JobOf(msgspec.Struct):
    """A call about one job: ``cancel``, ``status``, ``suspects``, ``progress``."""

    job: str

    def __post_init__(self) -> None:
        check_job(self.job)


# The longest a ``verdicts`` call waits for a change: a driver asks again after it, so a
# call never holds a caller (or a controller's connection) for long.
MAX_VERDICT_WAIT_S = 10.0


class NodesOf(msgspec.Struct):
    """A call about some nodes of one job: ``verdicts`` (the nodes its ranks ran on,
    which may have left its reservation since).

    ``unless``: the verdicts the caller holds already. Given, the call answers as soon as
    one differs (a suspect's slot moved, a node fenced or back), or after ``wait_s``
    seconds with what holds then, from what the controller's watch sees; without it, it
    asks the nodes' raylets now."""

    job: str
    nodes: tuple[str, ...] = ()  # a tuple: a mutable default would not pickle with the actor
    unless: dict[str, str] | None = None
    wait_s: float = 0.0

    def __post_init__(self) -> None:
        check_job(self.job)
        if not isinstance(self.nodes, (list, tuple)) or not all(
            isinstance(n, str) and n for n in self.nodes
        ):
            raise ReservationError(f"nodes {self.nodes!r}: expected a list of node ids")
        if self.unless is not None and not (
            isinstance(self.unless, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in self.unless.items())
        ):
            raise ReservationError(
                f"unless {self.unless!r}: expected the verdicts held, node id -> verdict"
            )
        w = self.wait_s
        if (
            isinstance(w, bool)
            or not isinstance(w, (int, float))
            or not 0 <= w <= MAX_VERDICT_WAIT_S
        ):
            raise ReservationError(
                f"wait_s {w!r}: expected seconds from 0 to {MAX_VERDICT_WAIT_S:g}"
            )


class ComponentOf(msgspec.Struct):
    """A call about one component of a job: ``assignments``, ``component``."""

    job: str
    component: str

    def __post_init__(self) -> None:
        check_job(self.job)
        if not isinstance(self.component, str) or not self.component:
            raise ReservationError(f"component {self.component!r}: expected a component name")


class Owned(msgspec.Struct):
    """A change to one job its owner makes (``release``, ``repair``): the owner's token,
    or ``force`` to act on another's."""

    job: str
    token: str = ""
    force: bool = False

    def __post_init__(self) -> None:
        check_job(self.job)
        check_token(self.token)
        check_flag(self.force, "force")


class Everyone(msgspec.Struct):
    """``release_all``: every reservation ``token`` owns (every one with ``force``)."""

    token: str = ""
    force: bool = False

    def __post_init__(self) -> None:
        check_token(self.token)
        check_flag(self.force, "force")


class Reserve(msgspec.Struct):
    """``reserve``: ``spec`` for ``job``, waiting at most ``timeout_s``; ``replace``
    another spec; the ``repair`` policy; the ``queue`` and ``priority`` it waits in; the
    owner's ``token`` (``force``: replace another's); whether a higher priority may take
    it back, and the grace it then has (0: the controller's)."""

    job: str
    spec: Any
    timeout_s: float = 300.0
    replace: bool = False
    repair: str = AUTO
    queue: str = ""
    priority: int = 0
    token: str = ""
    force: bool = False
    preemptible: bool = False
    preempt_grace_s: float = 0.0

    def __post_init__(self) -> None:
        check_job(self.job)
        self.spec = coerce_spec(self.spec)
        self.timeout_s = check_timeout(self.timeout_s)
        check_flag(self.replace, "replace")
        check_policy(self.repair)
        self.queue = check_queue(self.queue)
        check_priority(self.priority)
        check_token(self.token)
        check_flag(self.force, "force")
        check_flag(self.preemptible, "preemptible")
        if self.preempt_grace_s:
            self.preempt_grace_s = check_timeout(self.preempt_grace_s, "preempt_grace_s")


class Apply(msgspec.Struct):
    """``apply``: ``spec`` for the live ``job``, only what changes (``dry_run``: say what
    would), placed within ``timeout_s``."""

    job: str
    spec: Any
    timeout_s: float = 300.0
    dry_run: bool = False
    token: str = ""
    force: bool = False

    def __post_init__(self) -> None:
        check_job(self.job)
        self.spec = coerce_spec(self.spec)
        self.timeout_s = check_timeout(self.timeout_s)
        check_flag(self.dry_run, "dry_run")
        check_token(self.token)
        check_flag(self.force, "force")


class Resize(msgspec.Struct):
    """``resize``: :class:`Apply` with ``component`` given a new ``placement`` string,
    other node groups, or both."""

    job: str
    component: str
    placement: str | None = None
    node_group: str | list[str] | None = None
    timeout_s: float = 300.0
    dry_run: bool = False
    token: str = ""
    force: bool = False

    def __post_init__(self) -> None:
        ComponentOf(self.job, self.component)
        self.timeout_s = check_timeout(self.timeout_s)
        check_flag(self.dry_run, "dry_run")
        check_token(self.token)
        check_flag(self.force, "force")


class SetQuota(msgspec.Struct):
    """``set_quota``: ``queue``'s ``limits`` (resource -> most; ``{}`` removes it), with
    the operator's ``token`` or ``force``."""

    queue: str
    limits: dict[str, float]
    token: str = ""
    force: bool = False

    def __post_init__(self) -> None:
        self.queue = check_queue(self.queue, allow_empty=False)
        self.limits = check_quota(self.limits)
        check_token(self.token)
        check_flag(self.force, "force")


class CordonNode(msgspec.Struct):
    """``cordon``: no new slot on ``node`` (an id, a unique id prefix or an address);
    with ``drain``, every slot there moves off too, make before break; with ``fence``,
    the node is told dead to Ray now and every slot there is replaced at once, as for a
    node that died. ``why`` is kept for operators. Needs the operator's ``token``, or
    ``force``."""

    node: str
    drain: bool = False
    why: str = ""
    token: str = ""
    force: bool = False
    fence: bool = False

    def __post_init__(self) -> None:
        self.node = check_node_name(self.node)
        if not isinstance(self.why, str) or len(self.why) > 500:
            raise ReservationError(f"why {self.why!r}: expected a string of 500 characters at most")
        check_flag(self.drain, "drain")
        check_token(self.token)
        check_flag(self.force, "force")
        check_flag(self.fence, "fence")
        if self.fence and self.drain:
            raise ReservationError(
                "fence or drain, not both: a fence replaces the node's slots at once, a "
                "drain moves them make before break"
            )


class UncordonNode(msgspec.Struct):
    """``uncordon``: ``node`` takes new slots again. Needs the operator's ``token``, or
    ``force``."""

    node: str
    token: str = ""
    force: bool = False

    def __post_init__(self) -> None:
        self.node = check_node_name(self.node)
        check_token(self.token)
        check_flag(self.force, "force")


def check_node_name(node: object) -> str:
    """A node's name as given: a non-empty string (an id, a prefix, an address)."""
    if not isinstance(node, str) or not node.strip() or len(node) > 256:
        raise ReservationError(
            f"node {node!r}: expected a node id, the first 8 characters of one or more, "
            "or an address"
        )
    return node.strip()


class SetOperator(msgspec.Struct):
    """``set_operator``: make ``token`` the operator's (``force``: replace another)."""

    token: str
    force: bool = False

    def __post_init__(self) -> None:
        if not check_token(self.token):
            raise ReservationError("operator token: expected a non-empty string")
        check_flag(self.force, "force")


class EventsSince(msgspec.Struct):
    """``events``: the newest ``limit`` events (of ``job``, else all) above ``after``."""

    job: str | None = None
    after: int = 0
    limit: int = 100

    def __post_init__(self) -> None:
        if self.job is not None:
            check_job(self.job)
        if isinstance(self.after, bool) or not isinstance(self.after, int) or self.after < 0:
            raise ReservationError(f"after {self.after!r}: expected an event number >= 0")
        if (
            isinstance(self.limit, bool)
            or not isinstance(self.limit, int)
            or not 0 < self.limit <= 10_000
        ):
            raise ReservationError(f"limit {self.limit!r}: expected an int in [1, 10000]")


class Fault(msgspec.Struct):
    """``arm_fault`` (tests): crash the next time ``step`` is reached (None: disarm)."""

    step: str | None = None
