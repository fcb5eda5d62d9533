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
5. passes a CUDA IPC handle from the actor to the rollout process and reads the tensor.

Prints PASS or FAIL per check; exits 1 on any FAIL. On a machine without an NVIDIA GPU
it says so and checks nothing (exit 0).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

MIB = 1 << 20


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
        import torch

        self.error = ""
        try:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
            self.block = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
            self.block.fill_(1)
            torch.cuda.synchronize()
        except Exception as e:  # reported as a FAIL, not a crash
            self.error = f"{type(e).__name__}: {e}"

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
        }

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
    finally:
        for g in groups.values():
            g.shutdown()
        ctl.release("gpu-check")
    failed = [n for n, ok, _ in results if not ok]
    print(f"gpu_check: {len(results) - len(failed)} of {len(results)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
