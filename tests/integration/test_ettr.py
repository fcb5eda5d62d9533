"""The ETTR figure, bounded so it cannot regress unseen: the benchmark's short schedule
(``scripts/bench/bench_ettr.py --quick``) run with rollout that runs short and standby
trainers, beside a fault-free run of the same seed. The training math is the oracle:
the faulted run's rewards and losses equal the fault-free run's at every step, the step
a rollout node died in was not run again, and the one a trainer node died in ran its
update again but not its rollout (the rollout ranks' own count of prompts sampled)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.training import ROOT, quiet

# The quick schedule's degraded ETTR as measured (docs/evidence/benchmarks.md: 0.704 on
# this project's 2 cores with a spare of each kind, 0.469 when rollout's replacements
# had to load, where relaunching got 0.26 and starting over 0.08; its 10 steps of 1 s
# make every second of a recovery count): bound below it with room for CI's loaded
# cores, above what loading replacements gets. A trainer node's loss runs its update
# again (a promotion and a rejoin); a rollout node's costs the step it struck, its
# standbys admitted at that step's push: its next step came 1.3 s after it.
DEGRADED_ETTR_AT_LEAST = 0.55
# A figure the docs state, measured alone as they measured it.
pytestmark = pytest.mark.alone
NEXT_STEP_AFTER_ROLLOUT_LOSS_S = 6.0


def test_rollout_that_runs_short_keeps_the_ettr_and_changes_nothing_computed(tmp_path):
    out = tmp_path / "ettr.json"
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "bench" / "bench_ettr.py"),
        "--quick",
        "--modes=degraded",
        "--reference",
        f"--json={out}",
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, quiet(done.stdout)[-4000:] + quiet(done.stderr)[-6000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("ettr: degraded ") and "(faults 2, steps 10)" in last, last
    measures = {m["name"]: m for m in json.loads(out.read_text())["measures"]}
    assert measures["modes with metrics unequal to the first"]["samples"] == [0.0]
    degraded = measures["ettr, degraded"]
    faults = {kind: step for kind, step in degraded["faults"]}
    assert faults["rollout"] not in degraded["steps_redone"], degraded
    assert degraded["steps_redone"] == [faults["node"]], degraded  # the trainer's loss
    # ... its update, not its rollout: the rollout ranks sampled each step's prompts once
    assert degraded["rolled_again"] == [], degraded
    assert degraded["median"] >= DEGRADED_ETTR_AT_LEAST, last
    after = measures["to the next step after a fault, degraded"]["samples"]
    assert [kind for kind, _ in degraded["faults"]] == ["rollout", "node"]
    assert after[0] < NEXT_STEP_AFTER_ROLLOUT_LOSS_S, after
    assert measures["ettr, fault-free"]["median"] > 0.95  # the arithmetic's own check
