"""A user's run on a cluster with Ray's token authentication on, in a process of its own
(Ray reads its authentication mode once per process, so the suite's other clusters and
this one cannot share one): a reservation made with the CLI, attached from Python, a
worker group with one busy rank, a node killed without a word, ``repair()`` the instant
after, the reservation released with the CLI. Prints what Ray and the controller said,
as JSON, on its last line.

``--tls`` turns on Ray's mutual TLS as well, on certificates made here with Ray's own
helper (``ray._common.tls_utils``, what Ray's own TLS tests use).

``--placectl-token wrong`` gives placectl's own calls alone (its health checks and its
fence, through the test hook of :mod:`controller.runtime.edge.answers`) a token the cluster
does not accept, as a misconfigured controller would have.

Usage: python tests/integration/secured_driver.py [--tls] [--placectl-token right|wrong]
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
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


class Worker:
    def where(self) -> tuple[str, str]:
        import ray

        ctx = ray.get_runtime_context()
        return ctx.get_actor_id(), ctx.get_node_id()

    def spin(self, until: str, seconds: float) -> int:
        """Busy (holding the GIL, not dead) until the file ``until`` exists: the driver
        makes it once ``repair()`` has returned; ``seconds`` at most. Returns how often
        it looped, or 0 if the file never came (it stopped before the repair ended)."""
        end, n = time.time() + seconds, 0
        while time.time() < end:
            n += 1
            if n % 100_000 == 0 and os.path.exists(until):
                return n
        return 0


def certificates(where: pathlib.Path) -> dict[str, str]:
    """A self-signed certificate and key for every process of the local cluster, and
    the variables that turn Ray's TLS on with them. Made in a process of its own: this
    one must not import Ray before its variables are set."""
    make = (
        "import pathlib, sys; from ray._common.tls_utils import generate_self_signed_tls_certs; "
        "c, k = generate_self_signed_tls_certs(); w = pathlib.Path(sys.argv[1]); "
        "(w / 'server.crt').write_text(c); (w / 'server.key').write_text(k)"
    )
    subprocess.run([sys.executable, "-c", make, str(where)], check=True, timeout=120)
    return {
        "RAY_USE_TLS": "1",
        "RAY_TLS_SERVER_CERT": str(where / "server.crt"),
        "RAY_TLS_SERVER_KEY": str(where / "server.key"),
        "RAY_TLS_CA_CERT": str(where / "server.crt"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--placectl-token", choices=("right", "wrong"), default="right")
    parser.add_argument("--tls", action="store_true")
    args = parser.parse_args()
    token = secrets.token_hex(16)
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    if args.tls:
        env.update(certificates(pathlib.Path(tempfile.mkdtemp(prefix="placectl-tls-"))))
    if args.placectl_token == "wrong":
        env["PLACECTL_TEST_CALL_TOKEN"] = secrets.token_hex(16)
    os.environ.update(env)  # Ray reads its authentication mode once, at import
    import ray

    import clients
    from clients.testing import machines
    from clients.testing.local import local_cluster
    from tests.integration.conftest import placectl_cli as cli

    out: dict = {}
    with local_cluster(4, gpus=4, env=env) as (cluster, nodes):
        config = ROOT / "tests" / "integration" / "data" / "secured.yaml"
        done = cli(cluster.address, "reserve", "sec", str(config), "--timeout", "120")
        out["cli_reserve"] = [done.returncode, done.stderr.strip()[-300:]]
        ctl = clients.connect(address=cluster.address, start=False)
        res = ctl.reservation("sec")
        group = clients.WorkerGroup.launch(res, "actor", Worker)
        before = group.execute("where")
        placed = res.assignments("actor")
        lost = placed[0].placement.node_id
        busy = next(r for r, a in enumerate(placed) if a.placement.node_id != lost)
        released = pathlib.Path(tempfile.mkdtemp(prefix="placectl-busy-")) / "repaired"
        spinning = group.actors[busy].spin.remote(str(released), 120)
        doomed = [r for r, a in enumerate(placed) if a.placement.node_id == lost]
        started = time.monotonic()
        machines.crash(cluster, next(n for n in nodes if n.node_id == lost))
        out["repaired"] = group.repair(timeout=120)
        out["repair_s"] = round(time.monotonic() - started, 2)
        released.touch()  # busy all through the repair; done now
        out["doomed"] = doomed
        after = group.execute("where")
        out["kept_actors"] = [
            r for r in range(len(before)) if r not in doomed and after[r][0] == before[r][0]
        ]
        out["ranks"] = len(before)
        out["busy_rank"] = busy
        out["busy_done"] = ray.get(spinning, timeout=120) > 0
        health = ctl.health()
        out["fenced"] = sorted(health["fenced"])
        out["denied"] = health["denied"]
        out["lost"] = lost
        out["ray_dead"] = not next(n["Alive"] for n in ray.nodes() if n["NodeID"] == lost)
        out["events"] = [e.kind for e in ctl.events()]
        out["on_ray_nodes"] = sorted({n for _, n in after}) == sorted(
            {a.placement.node_id for a in res.assignments("actor")}
        )
        status = cli(cluster.address, "status", "sec")
        out["cli_status"] = [status.returncode, status.stdout[:200]]
        group.shutdown()
        done = cli(cluster.address, "release", "sec")
        out["cli_release"] = [done.returncode, done.stderr.strip()[-300:]]
        out["left"] = [r.job for r in ctl.list()]
    print(json.dumps(out))


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    main()
