#!/usr/bin/env python3
"""Check, on a machine with a real NVIDIA GPU, what real code does with placectl's
worker environment.

Starts a one-node Ray cluster with the machine's GPUs, reserves actor and rollout
colocated on GPU 0 with an engine there too, and in every process (and in the engine's
child, started with ``Assignment.child_options(0)``) does what training and inference
code does:

1. ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))``;
2. allocates memory on that device;
3. compares ``torch.cuda.get_device_properties(...).uuid`` with the UUID the assignment
   names (probed with nvidia-smi when the reservation was made);
4. checks that the colocated processes share one device: the same UUID, and memory one
   of them allocates is missing from what another sees free;
5. passes a CUDA IPC handle from the actor to the rollout process and reads the tensor;
6. forms a torch NCCL process group from the environment alone (``env://``) and
   all-reduces on the device;
7. has the engine rank start two plain OS processes that hold device memory, as SGLang's
   and vLLM's servers start theirs (one in the rank's session, one in a session of its
   own), kills the rank with ``SIGKILL`` as the OOM killer does, reads from the OS and
   from ``nvidia-smi`` which of them still hold the device (Ray ends the first; the
   second is placectl's to end), and has ``repair()`` relaunch the engine on the same
   device;
8. then, on a local cluster of two Ray nodes given one GPU each, promotes a standby
   after an abrupt node loss and checks that it works on its bundle's device
   (:mod:`gpu_check_standby`).

Prints PASS or FAIL per check (INFO for what is measured, not promised); exits 1 on any
FAIL. On a machine without an NVIDIA GPU
it says so and checks nothing (exit 0).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import gpu_check_standby

from controller.runtime.edge.node_tasks import alive

MIB = 1 << 20
# A process that holds device memory until it is killed, as an engine's server does.
HOLDER = (
    "import os, time, torch; torch.cuda.set_device(int(os.environ['LOCAL_RANK'])); "
    "x = torch.empty(512 << 20, dtype=torch.uint8, device='cuda'); x.fill_(3); "
    "torch.cuda.synchronize(); print('holding', flush=True); time.sleep(3600)"
)


def no_gpu_reason() -> str | None:
    """Why this machine cannot run the check, or None."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "nvidia-smi is not installed"
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi failed: {e}"
    if "GPU" not in listed:
        return "nvidia-smi lists no GPU"
    missing = []
    for module in ("torch", "ray", "msgspec", "yaml"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        return f"python {sys.executable} lacks {', '.join(missing)}"
    import torch

    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


class Probe:
    """A worker that does what real code does with its environment."""

    def __init__(self):
        self.error = ""
        self.promoted = False
        self._take_device()

    def _take_device(self):
        import torch

        try:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
            self.block = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
            self.block.fill_(1)
            torch.cuda.synchronize()
        except Exception as e:  # reported as a FAIL, not a crash
            self.error = f"{type(e).__name__}: {e}"

    def on_promote(self, env):
        """A standby made a rank: what a framework does then, on the rank's LOCAL_RANK."""
        self.promoted = True
        self._take_device()

    def report(self):
        import torch

        if self.error:
            return {"error": self.error}
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        free, _ = torch.cuda.mem_get_info()
        return {
            "error": "",
            "local_rank": os.environ["LOCAL_RANK"],
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "uuid": str(props.uuid),
            "free": free,
            "allocated": int(self.block.numel()),
            "pid": os.getpid(),
            "rank": os.environ.get("RANK"),
            "standby": os.environ.get("PLACECTL_STANDBY"),
            "promoted": self.promoted,
        }

    def pid(self):
        return os.getpid()

    def nccl_all_reduce(self):
        import torch
        import torch.distributed as dist

        dist.init_process_group("nccl")  # env://: RANK, WORLD_SIZE, MASTER_ADDR/PORT
        try:
            value = torch.full((1,), float(dist.get_rank() + 1), device="cuda")
            dist.all_reduce(value)
            torch.cuda.synchronize()
            return float(value.item()), dist.get_world_size()
        finally:
            dist.destroy_process_group()

    def start_holder(self, own_session: bool):
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, start_new_session=own_session
        )
        line = proc.stdout.readline().decode().strip()
        if line != "holding":
            raise RuntimeError(f"holder exited before holding memory: {proc.wait()}")
        self.holders = [*getattr(self, "holders", []), proc]
        return proc.pid

    def free_memory(self):
        import torch

        return torch.cuda.mem_get_info()[0]

    def allocate(self, mib):
        import torch

        self.extra = torch.empty(mib * MIB, dtype=torch.uint8, device="cuda")
        self.extra.fill_(2)
        torch.cuda.synchronize()
        return True

    def share(self):
        import torch
        from torch.multiprocessing.reductions import reduce_tensor

        self.shared = torch.arange(1024, dtype=torch.float32, device="cuda")
        torch.cuda.synchronize()
        return reduce_tensor(self.shared)

    def open(self, reduced):
        rebuild, args = reduced
        tensor = rebuild(*args)
        return float(tensor.sum().item())

    def spawn_child(self):
        import ray

        import clients

        me = clients.current()
        child = ray.remote(Probe).options(**me.child_options(0)).remote()
        return ray.get(child.report.remote())


def gpu_pids() -> dict[int, int] | None:
    """pid -> MiB of every process nvidia-smi says holds device memory (None: unreadable)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [line.split(",") for line in out.splitlines() if line.strip()]
    return {int(pid): int(mib) for pid, mib in rows}


def same_uuid(torch_uuid: str, smi_uuid: str) -> bool:
    return torch_uuid.removeprefix("GPU-").lower() == smi_uuid.removeprefix("GPU-").lower()


def main() -> int:
    reason = no_gpu_reason()
    if reason is not None:
        print(f"gpu_check: no NVIDIA GPU to check on this machine ({reason}); nothing was checked")
        return 0
    import ray

    import clients

    ray.init(logging_level="ERROR", log_to_driver=False)
    ctl = clients.connect()
    conf = {
        "num_nodes": 1,
        "component_placement": {
            "actor,rollout": "0",
            "engine": {"placement": "0", "capture_child_tasks": True},
        },
    }
    res = ctl.reserve("gpu-check", conf, timeout_s=120)
    results: list[tuple[str, bool, str]] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        results.append((name, ok, detail))
        print(
            f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  ({detail})" if detail else ""), flush=True
        )

    def info(name: str, detail: str) -> None:
        print(f"INFO  {name}  ({detail})", flush=True)

    groups = {c: clients.WorkerGroup.launch(res, c, Probe) for c in ("actor", "rollout", "engine")}
    try:
        reports = {c: g.execute("report")[0] for c, g in groups.items()}
        reports["engine child"] = groups["engine"].execute("spawn_child")[0]
        for who, r in reports.items():
            check(
                f"{who}: torch.cuda.set_device(LOCAL_RANK) and a 256 MiB allocation",
                not r["error"],
                r["error"] or f"LOCAL_RANK={r['local_rank']} CUDA_VISIBLE_DEVICES={r['visible']}",
            )
        expected = res.assignments("actor")[0].device_uuids
        for who, r in reports.items():
            if r["error"]:
                continue
            ok = bool(expected) and same_uuid(r["uuid"], expected[0])
            check(
                f"{who}: device UUID is the assignment's",
                ok,
                f"torch {r['uuid']}, assignment {expected}",
            )
        uuids = {r.get("uuid") for r in reports.values() if not r["error"]}
        check("colocated processes see one device", len(uuids) == 1, f"{sorted(uuids)}")
        before = groups["rollout"].execute("free_memory")[0]
        groups["actor"].execute("allocate", 1024)
        after = groups["rollout"].execute("free_memory")[0]
        drop = (before - after) / MIB
        check(
            "memory the actor allocates is gone for the rollout",
            drop >= 1000,
            f"free fell by {drop:.0f} MiB",
        )
        reduced = groups["actor"].execute("share")[0]
        total = groups["rollout"].execute("open", reduced)[0]
        check("CUDA IPC handle from actor to rollout", total == sum(range(1024)), f"sum {total}")
        summed, world = groups["actor"].execute("nccl_all_reduce")[0]
        check(
            "NCCL process group from the environment alone",
            summed == world * (world + 1) / 2,
            f"all_reduce {summed} over world size {world}",
        )
        left_behind(groups["engine"], reports, expected[0], check, info)
    finally:
        for g in groups.values():
            g.shutdown()
        ctl.release("gpu-check")
        ray.shutdown()
    try:
        gpu_check_standby.run(Probe, check, info, same_uuid)
    except Exception as e:  # a FAIL with its cause, not a crash before the summary
        check("standby case", False, f"{type(e).__name__}: {e}")
    failed = [n for n, ok, _ in results if not ok]
    print(f"gpu_check: {len(results) - len(failed)} of {len(results)} checks passed")
    return 1 if failed else 0


def left_behind(engine, reports, uuid: str, check, info) -> None:
    """SIGKILL the engine rank: what Ray ends at once, what is left holding the device
    until repair() ends it, and the engine relaunched on the same device."""
    holders = {
        "child in the rank's session": engine.execute("start_holder", False)[0],
        "child in a session of its own": engine.execute("start_holder", True)[0],
    }
    held = gpu_pids()
    if held is None:
        info("nvidia-smi --query-compute-apps", "unreadable here; the process table alone")
    else:
        listed = sorted(pid for pid in holders.values() if pid in held)
        info("holders nvidia-smi lists", f"{listed} of {sorted(holders.values())}")
    os.kill(engine.execute("pid")[0], signal.SIGKILL)
    killed = time.monotonic()
    rays = {
        "child actor (Ray's, owned by the rank)": reports["engine child"]["pid"],
        "child in the rank's session": holders["child in the rank's session"],
    }
    gone: dict[str, float] = {}
    while time.monotonic() - killed < 10 and len(gone) < len(rays):
        gone.update({n: time.monotonic() - killed for n, p in rays.items() if not alive(p)})
        time.sleep(0.1)
    for name, pid in rays.items():
        ended = f"ended {gone[name]:.1f} s after the rank's SIGKILL" if name in gone else "alive"
        check(f"engine {name} (pid {pid}) ends with the rank (Ray)", name in gone, ended)
    own = holders["child in a session of its own"]
    time.sleep(max(0.0, 5 - (time.monotonic() - killed)))  # Ray has had its time
    info(
        f"engine child in a session of its own (pid {own}), before repair()",
        f"alive {alive(own)}, holding {(gpu_pids() or {}).get(own, 0)} MiB "
        f"{time.monotonic() - killed:.0f} s after the rank's SIGKILL: Ray does not end it",
    )
    started = time.monotonic()
    relaunched = engine.repair(timeout=120)
    after = gpu_pids()
    check(
        f"engine child in a session of its own (pid {own}) ended by repair() (placectl)",
        not alive(own) and (after is None or own not in after),
        f"alive {alive(own)}, nvidia-smi lists it: {None if after is None else own in after}",
    )
    if alive(own):
        os.kill(own, signal.SIGKILL)
    again = engine.execute("report")[0]
    check(
        "repair() relaunches the engine on the same device",
        relaunched == [0] and not again["error"] and same_uuid(again["uuid"], uuid),
        f"relaunched {relaunched} in {time.monotonic() - started:.1f} s, "
        f"{again['error'] or again['uuid']}",
    )


if __name__ == "__main__":
    raise SystemExit(main())
