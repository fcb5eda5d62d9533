"""The controller's timing and pacing, with the reason beside each value. Each is set by
an environment variable of the controller's process, ``PLACECTL_`` and its name in
capitals (:func:`variable`), or by ``placectl start --set name=value`` (which passes the
same variable); ``docs/reference/settings.md`` lists them."""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec

from controller.errors import SettingsError
from controller.runtime.edge.answers import DOUBT_WAYS


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """How the controller paces itself. The defaults suit a real cluster; tests on the
    fake cluster shorten them."""

    # How often the loop reads Ray's node events: a node's death is acted on within this.
    reconcile_period: float = 1.0
    # The safety net: every group of every reservation is read this often, which catches
    # what no event reports (a group removed behind placectl's back).
    full_check_period: float = 10.0
    # How long a release waits for Ray to report its groups gone before it says so.
    removal_timeout: float = 30.0
    # Once its groups are gone, a release ends what the reservation's workers left on
    # each of its nodes (a daemon started by an engine: Ray ends only the workers),
    # waiting this long at most for a node to answer.
    leftovers_timeout: float = 15.0
    # How often an unreadable table is read again (an operator may fix it).
    refusal_retry: float = 5.0
    # Placing a replacement slot: its node was checked free, so this is quick or never.
    repair_timeout: float = 10.0
    # Without a spare node, look again this often (and whenever a node joins).
    repair_retry: float = 10.0
    # A node that does not answer a port check by then gets no lease (and stalls nothing).
    # The check is a task: on a node whose cores are saturated its worker takes seconds
    # to start (10 s failed 2 of 11 test runs on 2 cores under two busy loops).
    port_check_timeout: float = 30.0
    # Each node with room left gets an idle worker touched this often, so probes start
    # at once; at most warm_budget nodes per tick, so a big cluster is not flooded.
    warm_period: float = 30.0
    warm_budget: int = 32
    # Groups created but not yet placed, at once: the GCS schedules one group at a time.
    max_in_flight: int = 16
    # Placing a queued reservation admitted while its caller is gone (a controller
    # restart): it was admitted because it fits, so this is quick unless someone else's
    # actors took the room meanwhile; then it is queued again.
    admitted_place_timeout: float = 120.0
    # Raylets of the nodes holding slots are asked whether they answer this often, each
    # given this long: a raylet answers in milliseconds from its gRPC threads, however
    # busy its node (controller.runtime.steps.liveness).
    liveness_period: float = 1.0
    liveness_timeout: float = 1.0
    # A raylet refusing connections this long, heard refused on a second path (a witness,
    # or its second port where no witness replies), is gone: its node is fenced.
    refused_confirm: float = 0.2
    # A raylet silent this long, that witnesses cannot reach either (below), makes its
    # node a suspect: its slots move to other nodes at once, far before Ray's own health
    # checks give up (about a minute for a silent node with Ray's defaults); the node is
    # kept, and is free again if it answers. Counted from the first unanswered check.
    # Long enough that a node loaded to its limit still answers once in between.
    suspect_after: float = 2.0
    # A suspect still silent this long after its silence began is fenced (told dead to
    # Ray; it never comes back from that). 0: Ray's own detection of a silent node, from
    # the cluster's health-check settings (threshold x timeout + (threshold - 1) x period:
    # 62 s with Ray's defaults), so placectl never declares dead a node Ray would still
    # have kept; a blip shorter than it costs no node. Shorter trades nodes lost to blips
    # for GPUs freed sooner from a machine that is really gone (its slots moved anyway).
    fence_grace: float = 0.0
    # Each sweep the controller also asks a sample of the whole cluster: this many nodes
    # spread over its racks (every node of a cluster of at most twice this and one), its
    # quorum (controller.runtime.core.evidence). Reaching no strict majority of the
    # sample, it suspects itself (its own link is down) and fences nothing.
    quorum_sample: int = 4
    # A node silent past suspect_after is suspected only if this many other nodes that
    # answer the controller (or those of them that reply) cannot reach its raylet either;
    # they are spread over the racks (placectl.io/rack) or NVLink domains it reaches.
    witnesses: int = 2
    # A node in doubt (silent once) is asked over this many connections at once, by the
    # controller and by each witness, and answers if any one does: TCP holds a lost
    # packet's successors on its connection, so looks on one connection miss together
    # over a lossy link, where separate connections lose independently. A cut node
    # answers on none, and is suspected no later.
    looks: int = DOUBT_WAYS
    # A node suspected this many times within hold_down_window is held down: out of
    # placement (no slot, repair or held spare lands on it) for hold_down seconds, then
    # twice as long each time it is held down again within the window after the last
    # hold-down ended (at most 32 times hold_down). A flapping link would otherwise move
    # the job onto the node that just came back and off it again, every cycle. Watched
    # all the while; flapping alone never fences it. 0: never held down.
    hold_down_after: int = 3
    hold_down_window: float = 600.0
    hold_down: float = 120.0
    # A caller that suspects a node (status, repair) waits for its fence at most this
    # long: a fence takes milliseconds, but a GCS slow to answer must not hold the call
    # (the fence goes on, and Ray's node event is acted on when it comes).
    fence_wait: float = 2.0
    # A preemptible reservation taken back for one of higher priority keeps running this
    # long (its deadline, visible to its drivers and workers) before it is released.
    preempt_grace: float = 60.0
    # A slot moved off a draining node keeps its old group (and the workers in it) until
    # the drain's deadline, or this long after the move when the drain named none.
    drain_grace: float = 60.0
    # A node that joined for a reservation's demand is the owner's to use for this long
    # before the same owner asks the autoscaler again (controller.runtime.core.nodes).
    demand_grace: float = 10.0
    # Once a demand is placed and removed, Ray reports its resources free a moment later;
    # a spare is chosen only after that, waiting at most this long.
    demand_free_wait: float = 5.0
    # The event history (`placectl events`) keeps this many events, in memory and in
    # the GCS beside the table (a few hundred bytes each).
    events_kept: int = 1000
    # How often the queue and quota gauges are computed (a pass over every record); Ray
    # exports metrics every few seconds anyway.
    metrics_period: float = 5.0
    # The hooks tests use (``arm_fault``: crash at a named step) answer only here. A
    # controller is started with them by placectl's test clusters (clients.testing sets
    # PLACECTL_TEST_HOOKS=1 in every process of the cluster), never by an operator.
    test_hooks: bool = False


FAST = Settings(
    reconcile_period=0.005,
    full_check_period=0.1,
    removal_timeout=0.2,
    leftovers_timeout=0.2,
    refusal_retry=0.02,
    repair_timeout=1.0,
    repair_retry=0.05,
    port_check_timeout=0.2,
    admitted_place_timeout=2.0,
    preempt_grace=0.2,
    drain_grace=0.5,
    demand_grace=0.05,
    demand_free_wait=0.05,
    liveness_period=0.005,
    liveness_timeout=0.01,
    refused_confirm=0.0,
    suspect_after=0.05,
    fence_grace=3.0,
    fence_wait=0.5,
    metrics_period=0.01,
    test_hooks=True,
)
"""Settings for unit tests on the fake cluster, where nothing takes real time."""


PREFIX = "PLACECTL_"
# The least each setting may be: periods and waits must pass, counts may be zero where
# zero means "none" (warm_budget: no warm-up).
_LEAST: dict[str, float] = {
    "refused_confirm": 0.0,
    "fence_grace": 0.0,
    "warm_budget": 0,
    "max_in_flight": 1,
    "quorum_sample": 3,
    "hold_down_after": 0,
    "witnesses": 1,
}


# Settings that were renamed: a value given under the old name is refused, not ignored.
RENAMED = {
    "fence_after": "suspect_after (a silence that long, witnessed, moves the node's slots; "
    "the node is fenced only on proof or after fence_grace)",
}


def variable(name: str) -> str:
    """The environment variable that sets the setting ``name``: ``PLACECTL_`` + its name
    in capitals (``suspect_after`` -> ``PLACECTL_SUSPECT_AFTER``)."""
    return PREFIX + name.upper()


def _parse(name: str, default: object, raw: str) -> object:
    var = f"{variable(name)}={raw!r}"
    if isinstance(default, bool):
        truth = raw.strip().lower()
        if truth in ("1", "true", "yes", "on"):
            return True
        if truth in ("0", "false", "no", "off", ""):
            return False
        raise SettingsError(f"{var}: expected 1 or 0 (true or false); default {int(default)}")
    if isinstance(default, int):
        least = _LEAST.get(name, 1)
        try:
            count = int(raw)
        except ValueError:
            count = least - 1
        if count < least:
            raise SettingsError(f"{var}: expected a whole number >= {least}; default {default}")
        return count
    least = _LEAST.get(name)  # None: it must be more than zero
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (value <= 0 if least is None else value < least):
        bound = "> 0" if least is None else f">= {least:g}"
        raise SettingsError(f"{var}: expected a number of seconds {bound}; default {default:g}")
    return value


def from_environ(environ: Mapping[str, str], base: Settings | None = None) -> Settings:
    """``base`` (default: the defaults) with every setting ``environ`` names by its
    variable (:func:`variable`) taken from there.

    Raises:
        SettingsError: a variable's value is not one its setting takes; the message
            names the variable, what it takes and the default.
    """
    base = base or Settings()
    for old, new in RENAMED.items():
        if variable(old) in environ:
            raise SettingsError(f"{variable(old)} is no longer read: it is now {new}")
    values = {}
    for field in msgspec.structs.fields(Settings):
        raw = environ.get(variable(field.name))
        if raw is not None:
            values[field.name] = _parse(field.name, field.default, raw)
    return check(msgspec.structs.replace(base, **values))


def check(settings: Settings) -> Settings:
    """``settings`` if they make sense together.

    Raises:
        SettingsError: a hold-down window too short to count its suspicions in: shorter
            than ``fence_grace`` (a silence that long is fenced, not a flap) or than
            ``hold_down_after`` suspicions of ``suspect_after`` each.
    """
    s = settings
    if s.hold_down_after:
        least = max(s.fence_grace, s.hold_down_after * s.suspect_after)
        if s.hold_down_window < least:
            raise SettingsError(
                f"{variable('hold_down_window')}={s.hold_down_window:g}: expected at least "
                f"{least:g} s (fence_grace {s.fence_grace:g} s, hold_down_after "
                f"{s.hold_down_after} x suspect_after {s.suspect_after:g} s), or "
                f"{variable('hold_down_after')}=0 to hold no node down"
            )
    return settings


def by_name(given: Mapping[str, str]) -> dict[str, str]:
    """Settings given by name (``{"suspect_after": "3"}``, as ``placectl start --set``
    takes them), checked, as the variables that carry them to the controller.

    Raises:
        SettingsError: an unknown name, or a value its setting does not take.
    """
    names = [f.name for f in msgspec.structs.fields(Settings)]
    for old, new in RENAMED.items():
        if old in given:
            raise SettingsError(f"setting {old!r} was renamed: it is now {new}")
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise SettingsError(
            f"unknown setting {', '.join(map(repr, unknown))}; the settings are: "
            + ", ".join(names)
        )
    env = {variable(k): str(v) for k, v in given.items()}
    from_environ(env)
    return env


def changed(settings: Settings) -> dict[str, object]:
    """The settings that differ from the defaults, by name (the controller's health has
    them: ``placectl start --json`` shows it)."""
    default = Settings()
    return {
        f.name: getattr(settings, f.name)
        for f in msgspec.structs.fields(Settings)
        if getattr(settings, f.name) != getattr(default, f.name)
    }
