"""Tasks that run inside the cluster: the accelerator probe, the warm-up, the port
check, the witness and the leftovers' sweep. Kept apart, importing nothing but Ray,
because every node's probe worker imports this module: a lighter import is a faster
first probe."""

import ray


def _nvidia_identity(ids: list[int]) -> tuple[list[str], list[str]]:
    """UUID and PCI bus id of each NVIDIA device in ``ids`` (physical indices), from
    ``nvidia-smi``, which ignores CUDA_VISIBLE_DEVICES; empty where it is absent."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if not ids or exe is None:
        return [], []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [], []
    table = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            table[int(parts[0])] = (parts[1], parts[2])
    if not all(i in table for i in ids):
        return [], []
    return [table[i][0] for i in ids], [table[i][1] for i in ids]


@ray.remote(num_cpus=0, max_calls=0, max_retries=0)
def probe(accelerator: str) -> dict:
    """The physical ids of ``accelerator`` this task was given, sorted as ints, and on
    NVIDIA nodes the identity of each device."""
    raw = ray.get_runtime_context().get_accelerator_ids().get(accelerator, [])
    ids = sorted(int(i) for i in raw)
    uuids, buses = _nvidia_identity(ids) if accelerator == "GPU" else ([], [])
    return {"ids": ids, "uuids": uuids, "pci_bus_ids": buses}


@ray.remote(num_cpus=0, max_calls=0, max_retries=0)
def warm() -> None:
    """Nothing: running it starts (or keeps) an idle worker on the node."""


@ray.remote(num_cpus=0, max_restarts=0)
class Witness:
    """Kept standing on a few nodes, so that the controller's second opinion on a node
    silent to it (:mod:`controller.runtime.evidence`) waits for no process to start."""

    def ask(self, addresses: dict[str, str], timeout: float, ways: int = 1) -> dict[str, str]:
        """Whether the raylets at ``addresses`` answer *this* node, each asked over
        ``ways`` connections at once."""
        from controller.runtime.answers import answers

        return answers(addresses, timeout, ways=ways)


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range on this node (Linux), else IANA's."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split()[:2])
            return low, high
    except (OSError, ValueError):
        return 49152, 65535


@ray.remote(num_cpus=0, max_calls=0, max_retries=0)
def free_ports(candidates: list[int]) -> list[int]:
    """The ports of ``candidates`` (in order) that nothing on this node has bound and that
    lie outside the ephemeral range, where the kernel may hand them to any client."""
    import socket

    low, high = ephemeral_range()
    found = []
    for port in candidates:
        if low <= port <= high:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        found.append(port)
    return found


@ray.remote(num_cpus=0, max_calls=0, max_retries=0)
def end_leftovers(uid: str) -> list[str]:
    """End every process on this node that a worker of reservation ``uid`` left (its
    tag), Ray's own workers given their time to go; their command lines."""
    from controller.runtime.leftovers import end_tagged, reservation_prefix

    return [e.command for e in end_tagged([], prefixes=[reservation_prefix(uid)])]
