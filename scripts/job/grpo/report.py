"""What a person sees of a run: a line per step, the faults and what they cost, a plot
of reward against wall time, the comparison of a faulted run with a fault-free one, and
its effective training time ratio (ETTR)."""

from __future__ import annotations

import itertools
import math
import statistics

HEADER = (
    f"{'step':>4}  {'reward':>6}  {'exact':>5}  {'loss':>8}  {'time':>6}  {'epoch':>5}  rollout"
)


def step_line(m: dict, took: float | None) -> str:
    took_s = f"{took:5.2f}s" if took is not None else "     -"
    return (
        f"{m['step']:>4}  {m['reward']:6.3f}  {m['exact']:5.2f}  {m['loss']:+8.4f}  "
        f"{took_s}  {m['epoch']:>5}  {m['rollout_workers']:>7}"
    )


def event_line(e: dict) -> str:
    kind = e["kind"]
    secs = f" in {e['seconds']:.2f}s" if "seconds" in e else ""
    if kind in ("fault", "machine"):
        return f"      ** {e['what']}"
    if kind == "repaired":
        ranks = ", ".join(f"{c}{r}" for c, r in e["relaunched"].items()) or "none"
        parts = ", ".join(f"{k} {v:.2f}s" for k, v in e.get("parts", {}).items())
        stuck = e.get("restarted")
        more = f"; restarted actor{stuck}, stuck on the lost peer" if stuck else ""
        if e.get("detected") is not None:
            secs += f", {e['detected']:.2f}s after the fault"
        if e.get("promoted"):
            more += "; standbys promoted: " + ", ".join(f"{c}{r}" for c, r in e["promoted"].items())
        if e.get("short"):
            more += "; running short: " + ", ".join(f"{c}{r}" for c, r in e["short"].items())
        return (
            f"      -> repaired{secs} ({parts}): relaunched {ranks}{more}; epoch {e['epoch']}\n"
            f"         after {e['cause']}"
            + (
                "\n         rejoin: " + ", ".join(f"{k} {v:.2f}s" for k, v in e["rejoin"].items())
                if e.get("rejoin")
                else ""
            )
        )
    if kind == "recovery failed":
        return f"      -> the recovery failed{secs}, the step is tried again: {e['cause']}"
    if kind == "restarted":
        return f"      -> started over{secs}: released, reserved, relaunched every worker"
    if kind == "attached":
        lost = e.get("relaunched") or {}
        extra = f", relaunched {lost}" if lost else ""
        return f"      -> a new driver attached to the reservation and its workers{secs}{extra}"
    if kind == "launched":
        how = "a new driver reserved and launched" if e.get("resume") else "launched"
        return f"      -> {how} every worker{secs}"
    if kind == "preparing":
        return (
            f"      -> slots moved off draining node(s) {', '.join(e['leaving'])} (epoch "
            f"{e['epoch']}): starting {e['ranks']} beside the running workers"
        )
    if kind == "moved":
        parts = ", ".join(f"{k} {v:.2f}s" for k, v in e.get("parts", {}).items())
        return f"      -> moved {e['moved']} between two steps{secs} ({parts})"
    if kind == "short":
        when = f", {e['detected']:.2f}s after the fault" if e.get("detected") is not None else ""
        return (
            f"      -> rollout ranks {e['lost']} lost{secs}{when}: the step goes on with "
            f"{e['serving']} rollout workers, their replacements start in the background"
        )
    if kind == "admitted":
        return f"      -> rollout ranks {e['ranks']} admitted back at the weight push"
    if kind == "sampled":
        again = rolled_again(e)
        return f"      -> the rollout ranks sampled {e['per_step']} prompts a step; " + (
            f"steps rolled out again: {again}" if again else "no step rolled out again"
        )
    if kind == "grew":
        return (
            f"      -> rollout grew to {e['rollout']} workers{secs} (started {e['started']}); "
            f"trainer ranks kept running: {e['trainers_kept']} of 4; epoch {e['epoch']}"
        )
    return f"      -> {e}"


def recoveries(run: dict) -> list[dict]:
    """Each fault with the seconds from it to the next finished step."""
    out = []
    for f in run["faults"]:
        after = [s["finished_at"] for s in run["steps"] if s["finished_at"] > f["at"]]
        nxt = min(after) if after else math.nan
        out.append({**f, "seconds": nxt - f["at"]})
    return out


def rolled_again(sampled: dict) -> list[int]:
    """The steps whose prompts the rollout ranks sampled more than once, by their own
    count (a ``sampled`` event: JSON's keys are strings)."""
    per_step = sampled["per_step"]
    return sorted(int(step) for step, n in sampled["prompts"].items() if n > per_step)


def lost_seconds(run: dict, fault: dict) -> dict:
    """What a fault cost the run: the steps run again, the slowest step after it, the
    median step before it, and the seconds lost (every step after the fault beyond that
    median, recoveries included)."""
    steps = run["steps"]
    took = [(s, s["finished_at"] - p["finished_at"]) for p, s in itertools.pairwise(steps)]
    before = sorted(t for s, t in took if s["finished_at"] <= fault["at"])
    normal = before[len(before) // 2] if before else math.nan
    after = [t for s, t in took if s["finished_at"] > fault["at"]]
    events = [e for e in run["events"] if e.get("kind") in ("repaired", "restarted")]
    return {
        "normal_step_s": normal,
        "slowest_after_s": max(after) if after else math.nan,
        "lost_s": sum(max(0.0, t - normal) for t in after),
        "steps_run_again": len(events),
    }


def compare(reference: list[dict], faulted: list[dict]) -> tuple[bool, str]:
    """Whether two runs' per-step metrics agree (the same rewards, losses within 1e-6)."""
    if [m["step"] for m in reference] != [m["step"] for m in faulted]:
        return False, f"steps differ: {len(reference)} vs {len(faulted)}"
    worst = 0.0
    for a, b in zip(reference, faulted, strict=True):
        if (a["reward"], a["exact"]) != (b["reward"], b["exact"]):
            return False, f"step {a['step']}: reward {a['reward']} vs {b['reward']}"
        worst = max(worst, abs(a["loss"] - b["loss"]))
    if worst > 1e-6:
        return False, f"losses differ by up to {worst:.3g}"
    return True, f"equal at all {len(reference)} steps: same rewards, losses within {worst:.1g}"


def plot(runs: dict[str, dict], path: str) -> str:
    """Reward against wall time from each run's first step, faults marked; says where it
    went, or why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'placectl[plot]')"
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, run in runs.items():
        t0 = run["steps"][0]["finished_at"]  # aligned at step 1: launches differ
        xs = [s["finished_at"] - t0 for s in run["steps"]]
        ax.plot(xs, [s["reward"] for s in run["steps"]], marker=".", label=name)
        for k, f in enumerate(recoveries(run)):
            ax.axvline(f["at"] - t0, color="tab:red", linestyle="--", linewidth=1)
            ax.annotate(
                f"{f['kind']} @{f['step']}\n+{f['seconds']:.1f}s",
                (f["at"] - t0, 0.02 + 0.1 * (k % 3)),
                fontsize=8,
                color="tab:red",
                xytext=(3, 0),
                textcoords="offset points",
            )
    ax.set_xlabel("wall time since step 1 finished (s)")
    ax.set_ylabel("mean reward")
    ax.set_ylim(0, 1)
    ax.set_title("GRPO on placectl: reward against wall time, faults marked")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot: {path}"


def step_seconds(m: dict) -> float:
    """How long a finished step took: its parts (rollout, reward, train, sync)."""
    return sum(m["seconds"].values())


def ettr(run: dict) -> dict:
    """Effective training time ratio of one run: the time its steps would have taken
    without faults over the wall time it took, from the first step's start to the last
    step's end (the launch before, the same in every mode, is left out).

    A step's fault-free time is the median step before the first fault (the first step,
    the slowest, left out; every step but the first when too few came before), the same
    steps in every mode of one schedule: a step that ran slower while a rollout rank was
    missing counts what it should have taken, not what it took, and a failed attempt
    counts nothing. Also: the steps redone (a step whose first attempt failed), those of
    them whose prompts were sampled again (the rollout ranks' own count), and each
    fault's seconds to the next finished step."""
    steps = run["steps"]
    first = steps[0]["finished_at"] - step_seconds(steps[0])
    wall = steps[-1]["finished_at"] - first
    faulted = min((f["at"] for f in run["faults"]), default=math.inf)
    calm = [step_seconds(m) for m in steps[1:] if m["finished_at"] <= faulted]
    typical = statistics.median(calm if len(calm) >= 2 else [step_seconds(m) for m in steps[1:]])
    redone = {
        e["step"]
        for e in run["events"]
        if e.get("kind") in ("repaired", "restarted", "recovery failed") and "step" in e
    }
    return {
        "ettr": len(steps) * typical / wall if wall > 0 else math.nan,
        "wall_s": wall,
        "step_s": typical,
        "steps": len(steps),
        "redone": len(redone),
        "redone_steps": sorted(redone),
        # None when the ranks' count is not in the record (a run from before it)
        "rolled_again": next(
            (rolled_again(e) for e in run["events"] if e.get("kind") == "sampled"), None
        ),
        "to_next_step_s": [f["seconds"] for f in recoveries(run)],
    }
