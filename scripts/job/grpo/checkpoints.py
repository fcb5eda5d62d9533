"""The run's checkpoints: one shard per trainer rank per step, as sharded trainers write
them, and the driver's commit record.

A step counts only once the driver has committed it (after every rank wrote its shard
and the step's metrics were recorded): a fault before that, the driver's death
included, resumes from the previous committed step, and every rank restores its own
shard of it. A rank that kept its node and rank across a driver restart finds its shard
where it left it; on a real cluster ``root`` is a path every node shares.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

KEEP = 3  # committed steps kept on disk


class Checkpoints:
    """Shards, the commit record and the metrics of one run, under ``root``."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = pathlib.Path(root)

    def shard(self, step: int, rank: int) -> pathlib.Path:
        return self.root / f"step-{step:05d}" / f"rank-{rank}.pt"

    def save_shard(self, step: int, rank: int, state: dict) -> None:
        """Write a rank's shard whole or not at all."""
        import torch

        path = self.shard(step, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(state, tmp)
        os.replace(tmp, path)

    def load_shard(self, step: int, rank: int) -> dict | None:
        import torch

        path = self.shard(step, rank)
        return torch.load(path, weights_only=False) if path.exists() else None

    def committed(self) -> int:
        """The last committed step (0: none; the run starts from its initial state)."""
        path = self.root / "committed"
        return int(path.read_text()) if path.exists() else 0

    def metrics(self) -> list[dict]:
        """The recorded metrics of every committed step, in order."""
        path = self.root / "metrics.jsonl"
        if not path.exists():
            return []
        last = self.committed()
        rows = [json.loads(line) for line in path.read_text().splitlines() if line]
        return [r for r in rows if r["step"] <= last]

    def commit(self, step: int, metrics: dict) -> None:
        """Record ``step``'s metrics, then mark it committed (each write atomic), and
        drop shards older than the last few committed steps."""
        self.root.mkdir(parents=True, exist_ok=True)
        rows = [r for r in self.metrics() if r["step"] < step] + [metrics]
        _write(self.root / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        _write(self.root / "committed", str(step))
        for old in self.root.glob("step-*"):
            if int(old.name[5:]) < step - KEEP + 1 and int(old.name[5:]) != 0:
                shutil.rmtree(old, ignore_errors=True)


def _write(path: pathlib.Path, text: str) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
