"""The quickstart (README): launch the reservation's trainer ranks and ask each where it
runs, as the worker's environment and Ray itself say."""

import os

import ray

import clients


class Worker:
    def hello(self) -> str:
        env = os.environ
        return (
            f"rank {env['RANK']} of {env['WORLD_SIZE']}: LOCAL_RANK={env['LOCAL_RANK']} "
            f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} "
            f"MASTER={env['MASTER_ADDR']}:{env['MASTER_PORT']}; "
            f"Ray gave it GPU {[int(g) for g in ray.get_gpu_ids()]}"
        )


ctl = clients.connect(address="auto")
res = ctl.reservation("demo")  # reads the reservation the CLI made, from the GCS
group = clients.WorkerGroup.launch(res, "actor", Worker)
print("\n".join(group.execute("hello")))
group.shutdown()
