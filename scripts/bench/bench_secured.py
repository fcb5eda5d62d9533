#!/usr/bin/env python3
"""Fault detection on a secured cluster: seconds from an abrupt node death to Ray's node
table saying dead (placectl's fence, or Ray's own checks) and to ``repair()``'s return,
with no security, with token authentication, and with token authentication and TLS, in
one run; and, as the floor placectl falls back to, a token cluster whose GCS refuses
placectl's fence (a wrong token for placectl's calls alone).

Ray reads its security settings once per process, so each setting runs in a process of
its own (this script, with ``--setting``): a head and three nodes of 4 fake GPUs, two
reserved (``actor: 0-7``), one spare; per trial a worker group is launched, one
reserved node is killed without a word, ``repair()`` is called at once, and the node
is added back.

Usage: scripts/bench/bench_secured.py [--trials 3] [--settings none,token,tls,refused]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import secrets
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from harness import Results, parser

SETTINGS = ("none", "token", "tls", "refused")
SPEC = {"num_nodes": 3, "component_placement": {"actor": "0-7"}}


def environment(setting: str, where: pathlib.Path) -> dict[str, str]:
    """The variables of ``setting``, for every process of its cluster."""
    if setting == "none":
        return {}
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    if setting == "refused":
        env["PLACECTL_TEST_CALL_TOKEN"] = secrets.token_hex(16)  # placectl's calls only
    if setting == "tls":
        make = (
            "import pathlib, sys; from ray._common.tls_utils import "
            "generate_self_signed_tls_certs as g; c, k = g(); w = pathlib.Path(sys.argv[1]); "
            "(w / 'c.pem').write_text(c); (w / 'k.pem').write_text(k)"
        )
        subprocess.run([sys.executable, "-c", make, str(where)], check=True, timeout=120)
        cert, key = str(where / "c.pem"), str(where / "k.pem")
        env.update(
            RAY_USE_TLS="1", RAY_TLS_SERVER_CERT=cert, RAY_TLS_SERVER_KEY=key, RAY_TLS_CA_CERT=cert
        )
    return env


class Worker:
    def ping(self) -> int:
        return 1


def child(setting: str, trials: int) -> None:
    """One setting's trials, in this process; prints their seconds as JSON."""
    os.environ.update(environment(setting, pathlib.Path(tempfile.mkdtemp())))
    import ray

    import clients
    from clients.testing import machines
    from clients.testing.local import local_cluster

    dead_s, repair_s, relaunched = [], [], []
    with local_cluster(3, gpus=4, log_level="ERROR") as (cluster, _):
        ctl = clients.connect()
        res = ctl.reserve("bench", SPEC, timeout_s=120)
        for _ in range(trials):
            group = clients.WorkerGroup.launch(res, "actor", Worker)
            group.execute("ping")
            lost = res.assignments("actor")[0].placement.node_id
            node = next(n for n in cluster.list_all_nodes() if n.node_id == lost)
            seen: list[float] = []
            watch = threading.Thread(target=_until_dead, args=(ray, lost, seen), daemon=True)
            started = time.monotonic()
            watch.start()
            machines.crash(cluster, node)
            relaunched.append(group.repair(timeout=120))
            repair_s.append(time.monotonic() - started)
            watch.join(120)
            dead_s.append(seen[0] - started)
            group.shutdown()
            cluster.add_node(num_cpus=4, num_gpus=4)
            cluster.wait_for_nodes()
        ctl.release("bench")
    print(json.dumps({"dead": dead_s, "repair": repair_s, "relaunched": relaunched}))


def _until_dead(ray, node_id: str, seen: list[float]) -> None:
    """Poll Ray's node table until it says ``node_id`` is dead; the moment, in ``seen``."""
    while any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()):
        time.sleep(0.05)
    seen.append(time.monotonic())


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--setting", help=argparse.SUPPRESS)  # one setting, in this process
    args = ap.parse_args()
    if args.setting:
        child(args.setting, args.trials)
        return 0
    results = Results("secured", args)
    rows = []
    for setting in [s for s in args.settings.split(",") if s]:
        if setting not in SETTINGS:
            ap.error(f"--settings: {setting!r} is not one of {', '.join(SETTINGS)}")
        done = subprocess.run(
            [sys.executable, __file__, "--setting", setting, "--trials", str(args.trials)],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
        got = json.loads(done.stdout.strip().splitlines()[-1])
        beside = setting != "none" and "none" in [r[0] for r in rows]
        for what, key in (("dead in Ray's table", "dead"), ("repair() returned", "repair")):
            base = f"none: {what}" if beside else None
            results.add(f"{setting}: {what}", got[key], baseline=base)
        rows.append((setting, got))
        print(f"  {setting}: dead {got['dead']}, repair {got['repair']}", flush=True)
    print(f"\n== seconds from an abrupt node death (median of {args.trials})")
    print(f"{'setting':<10} {'dead in Ray':>12} {'repair()':>10}")
    for setting, got in rows:
        dead, rep = sorted(got["dead"]), sorted(got["repair"])
        print(f"{setting:<10} {dead[len(dead) // 2]:>12.2f} {rep[len(rep) // 2]:>10.2f}")
    results.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
