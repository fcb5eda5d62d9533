"""The processes placectl places: trainer ranks (``actor``), rollout workers colocated
with them (``rollout``) and reward workers on a node (``reward``).

Each reads its rank, world size, devices and master address from the environment
placectl gave it, as a torchrun or RLinf worker does; a trainer forms its DDP group from
that environment alone, and reads it again (``clients.current()``) when it rejoins after
a repair moved rank 0.
"""

from __future__ import annotations

import datetime
import os
import time

# A collective with a dead peer fails within milliseconds (the connection resets), and a
# rank whose collective failed closes its own (Trainer.leave); this bounds the rest.
GLOO_TIMEOUT_S = 30


def where() -> dict:
    """Where this process runs, as Ray and the environment say."""
    import ray

    env = os.environ
    return {
        "rank": int(env["RANK"]),
        "node": ray.get_runtime_context().get_node_id(),
        "devices": env.get("CUDA_VISIBLE_DEVICES", ""),
        "local_rank": int(env["LOCAL_RANK"]),
        "pid": os.getpid(),
    }


def loading(config) -> None:
    """What a real rank's start costs beyond its process (a model loaded, an engine
    warmed up): ``config.load_s`` seconds, a stand-in the ETTR benchmark sets."""
    if config.load_s:
        time.sleep(config.load_s)


class Trainer:
    """One rank of the policy's trainer: a DDP replica over gloo."""

    def __init__(self, config, checkpoints: str) -> None:
        import torch

        from grpo import task
        from grpo.checkpoints import Checkpoints

        torch.set_num_threads(1)  # deterministic, and two cores shared by every process
        if torch.cuda.is_available():  # on a real GPU: the process's own first device
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        self.config = config
        self.rank = int(os.environ.get("RANK", "-1"))  # none yet on a standby
        self.policy, self.optim = task.build(config)
        loading(config)
        self.ddp = None
        self.store = None  # rank 0's store, opened by host() for the next join()
        self.checkpoints = Checkpoints(checkpoints)

    def on_promote(self, env: dict) -> None:
        """A standby made this rank (placectl's warm standby): the job's rejoin forms
        the group and restores the shard next."""
        self.rank = int(env["RANK"])

    def host(self) -> None:
        """Rank 0: open the group's store now, before any other rank dials it. A rank
        that dials a store not yet listening tries again only after torch's connect
        backoff (0.5 s and more), which was most of a rejoin after a crash."""
        import clients

        self.leave()
        self.store = self._store(clients.current().env, master=True)

    def join(self, step: int) -> dict:
        """(Re)form the process group from the current assignment (the master may have
        moved) and restore ``step``'s shard; step 0 is the initial state. The group forms
        on rank 0's store, opened by :meth:`host` beforehand, which the others dial at
        MASTER_ADDR:MASTER_PORT, as ``env://`` would."""
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        import clients

        t0 = time.perf_counter()
        env = clients.current().env
        store, self.store = self.store, None
        if store is None:  # rank 0 without host(), or any other rank
            self.leave()
            store = self._store(env, master=env["RANK"] == "0")
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            os.environ[key] = env[key]
        t1 = time.perf_counter()
        dist.init_process_group(
            "gloo",
            store=store,
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S),
        )
        t2 = time.perf_counter()
        self.restore(step)
        t3 = time.perf_counter()
        self.ddp = DistributedDataParallel(self.policy)
        t4 = time.perf_counter()
        took = {"store": t1 - t0, "init": t2 - t1, "restore": t3 - t2, "ddp": t4 - t3}
        return {**where(), "master": f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}", "took": took}

    @staticmethod
    def _store(env: dict, master: bool):
        """The group's key-value store at ``env``'s MASTER_ADDR:MASTER_PORT: served by
        rank 0, dialled by the others."""
        import torch.distributed as dist

        return dist.TCPStore(
            env["MASTER_ADDR"],
            int(env["MASTER_PORT"]),
            int(env["WORLD_SIZE"]),
            is_master=master,
            timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S),
            wait_for_workers=False,
        )

    def restore(self, step: int) -> None:
        from grpo import task

        state = self.checkpoints.load_shard(step, self.rank)
        if state is None:
            if step != 0:
                raise FileNotFoundError(f"no shard of step {step} for rank {self.rank}")
            self.policy, self.optim = task.build(self.config)
            self.checkpoints.save_shard(0, self.rank, self._state())
            return
        self.policy.load_state_dict(state["policy"])
        self.optim.load_state_dict(state["optim"])

    def _state(self) -> dict:
        return {"policy": self.policy.state_dict(), "optim": self.optim.state_dict()}

    def train(self, step: int, batch: list) -> float:
        """One GRPO update on this rank's shard of the batch (gradients averaged across
        ranks by DDP), then this rank's checkpoint shard of ``step``; its loss."""
        from grpo import task

        try:
            loss = task.loss(self.ddp, batch)
            self.optim.zero_grad()
            loss.backward()
        except Exception:
            self.leave()
            raise
        self.optim.step()
        self.checkpoints.save_shard(step, self.rank, self._state())
        return float(loss.item())

    def leave(self) -> None:
        """Tear the process group down now. A collective that failed here (a peer died)
        may leave a surviving peer waiting on this rank; closing this rank's
        connections fails that peer's collective at once instead of at the timeout."""
        import gc

        import torch.distributed as dist

        self.ddp = self.store = None
        if dist.is_initialized():
            dist.destroy_process_group()
            gc.collect()  # the group's connections close when its last reference goes

    def weights(self) -> dict:
        return self.policy.pushed()

    def where(self) -> dict:
        return where()


class Generator:
    """A rollout worker: samples groups with the policy the trainer last published."""

    def __init__(self, config) -> None:
        import torch

        from grpo import task

        torch.set_num_threads(1)
        self.config = config
        self.policy = task.Policy(config.hidden)
        self.sampled: dict[int, int] = {}  # prompts sampled, by step: generate()'s calls
        loading(config)

    def load(self, weights: dict, version: int) -> int:
        """Take the weights of step ``version`` (the rank says it holds them:
        ``clients.weights``); returns the version now held."""
        import clients.weights

        self.policy.load_state_dict(weights)
        clients.weights.hold(version)
        return version

    def generate(self, step: int, indices: list[int], version: int) -> list[tuple[int, int, list]]:
        """The groups of the step's prompts ``indices``: (index, target, samples) each,
        sampled with the weights of step ``version`` or refused."""
        import clients.weights
        from grpo import task

        clients.weights.require(version)  # a rank that joined since the push refuses

        targets = task.targets(self.config, step)
        out = []
        for i in indices:
            out.append((i, targets[i], task.sample(self.policy, self.config, step, i, targets[i])))
            if self.config.gpu_ms_per_token:  # the simulated accelerator's decode time
                time.sleep(self.config.gpu_ms_per_token * task.DIGITS / 1000)
        self.sampled[step] = self.sampled.get(step, 0) + len(indices)
        return out

    def sampled_prompts(self) -> dict[int, int]:
        """How many prompts this worker has sampled for each step, all calls counted: a
        step rolled out again counts twice."""
        return dict(self.sampled)

    def where(self) -> dict:
        return where()


class Scorer:
    """A reward worker (CPU only, one of the node's processes)."""

    def score(self, groups: list[tuple[int, int, list]]) -> list[list[float]]:
        from grpo.reward import reward

        return [[reward(target, s) for s in samples] for _, target, samples in groups]

    def where(self) -> dict:
        return where()
