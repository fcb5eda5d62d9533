"""The accelerator probe. Kept apart, importing nothing but Ray, because every node's
probe worker imports it: a lighter import is a faster first probe."""

import ray


@ray.remote(num_cpus=0, max_calls=0, max_retries=0)
def probe(accelerator: str) -> list[int]:
    """The physical ids of ``accelerator`` this task was given, sorted as ints."""
    ids = ray.get_runtime_context().get_accelerator_ids().get(accelerator, [])
    return sorted(int(i) for i in ids)


@ray.remote(num_cpus=0, max_calls=0, max_retries=0)
def free_ports(candidates: list[int], count: int, consecutive: bool) -> list[int]:
    """The first ``count`` of ``candidates`` (ascending) that nothing on this node has
    bound, checked by binding each; ``consecutive`` asks for an unbroken run."""
    import socket

    def free(port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                return False
            return True

    found: list[int] = []
    for port in candidates:
        if consecutive and found and port != found[-1] + 1:
            found = []
        if free(port):
            found.append(port)
            if len(found) == count:
                return found
        elif consecutive:
            found = []
    return []
