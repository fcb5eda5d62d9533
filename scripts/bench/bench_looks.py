#!/usr/bin/env python3
"""How often a lossy link makes a raylet that runs look silent: one connection per look
beside placectl's looks (one connection, then ``looks`` at once while in doubt), in one run.

A Ray cluster of two hosts in network namespaces (clients.testing.hosts): the head and
one worker host whose link loses ``--loss`` of its packets both ways. Two probe
processes on the head look at the worker's raylet every ``liveness_period`` with
``liveness_timeout``, as the controller's sweep does, side by side on the same link:

* ``one``: every look over the one kept connection (placectl before ``looks``);
* ``placectl``: the rule of ``controller.runtime.steps.liveness``: one connection while the
  node answers, ``looks`` connections at once from its first silent look on (and a
  stalled one replaced when another answers);
* a number N: N connections at every look.

For each: the share of looks that came back silent, the longest silence, and the
silences that lasted ``suspect_after`` (counted as the sweep counts them: from the start of
the first silent look to the end of a later one). Each of those is a fence the
witnesses alone stand between; placectl's rule wants none.

Needs root and iproute2. Usage: scripts/bench/bench_looks.py [--seconds 300]
[--loss 0.3] [--modes one,placectl,3] [--json PATH]
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from harness import Results, parser

from clients.testing import hosts as harness
from controller.runtime.core.settings import Settings

RULE = Settings()


def probe(address: str, mode: str, seconds: float) -> None:
    """Look at ``address`` as ``mode`` says for ``seconds``; one JSON line per look."""
    from controller.runtime.edge.answers import OK, answers

    doubt, end = False, time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.monotonic()
        ways = {"one": 1, "placectl": RULE.looks if doubt else 1}.get(mode) or int(mode)
        got = answers({"n": address}, RULE.liveness_timeout, ways=ways)["n"]
        done = time.monotonic()
        doubt = got != OK
        print(json.dumps({"began": began, "done": done, "answer": got, "ways": ways}), flush=True)
        time.sleep(max(RULE.liveness_period - (done - began), 0.0))


def spells(looks: list[dict]) -> list[float]:
    """Each run of silent looks, as long as the sweep counts it (first start to last end)."""
    out, since = [], None
    for look in looks:
        if look["answer"] == "ok":
            since = None
            continue
        since = look["began"] if since is None else since
        if out and out[-1][0] == since:
            out[-1] = (since, look["done"] - since)
        else:
            out.append((since, look["done"] - since))
    return [length for _, length in out]


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--seconds", type=float, default=300.0, help="how long each probe looks")
    ap.add_argument("--loss", type=float, default=0.3, help="share of packets lost both ways")
    ap.add_argument(
        "--modes", default="one,placectl,3", help="one, placectl, or N (N connections always)"
    )
    args = ap.parse_args()
    results = Results("looks", args)
    here = pathlib.Path(__file__).resolve()
    with harness.Hosts(workers=1, gpus=0, cpus=1) as hosts:
        target = f"{hosts.hosts[1].ip}:{harness.RAYLET_PORT}"
        hosts.degrade(1, args.loss)
        print(f"{args.loss:.0%} of packets lost on {hosts.hosts[1].ip}; looking for "
              f"{args.seconds:g}s", file=sys.stderr)  # fmt: skip
        procs = {
            mode: hosts.run(
                0,
                [sys.executable, str(here), "--probe", mode, target, str(args.seconds)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for mode in args.modes.split(",")
        }
        looks = {mode: [json.loads(line) for line in p.stdout] for mode, p in procs.items()}
        for p in procs.values():
            p.wait()
    for mode, seen in looks.items():
        silent = [look for look in seen if look["answer"] != "ok"]
        lengths = spells(seen)
        fenced = [s for s in lengths if s >= RULE.suspect_after]
        name = f"{mode}: silences"
        results.add(
            name,
            lengths or [0.0],
            looks=len(seen),
            silent_looks=len(silent),
            silent_share=len(silent) / max(len(seen), 1),
            silences_past_suspect_after=len(fenced),
            baseline="one: silences" if mode == "placectl" else None,
        )
        print(
            f"{mode:>9}: {len(seen)} looks, {len(silent)} silent "
            f"({len(silent) / max(len(seen), 1):.1%}), longest silence "
            f"{max(lengths, default=0.0):.1f}s, {len(fenced)} silence(s) of "
            f"{RULE.suspect_after:g}s or more"
        )
    results.write()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--probe":
        probe(address=sys.argv[3], mode=sys.argv[2], seconds=float(sys.argv[4]))
    else:
        main()
