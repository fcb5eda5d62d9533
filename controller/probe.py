"""The accelerator probe. Kept apart, importing nothing but Ray, because every node's
probe worker imports it: a lighter import is a faster first probe."""

import ray


@ray.remote(num_cpus=0, max_calls=0, max_retries=0)
def probe(accelerator: str) -> list[int]:
    """The physical ids of ``accelerator`` this task was given, sorted as ints."""
    ids = ray.get_runtime_context().get_accelerator_ids().get(accelerator, [])
    return sorted(int(i) for i in ids)
