"""The controller's metrics, exported through Ray's metrics system (Prometheus)."""

from __future__ import annotations


class RayMetrics:
    """``placectl_reservations{state}``, ``placectl_reserved_accelerators{job}``,
    ``placectl_reserve_latency_seconds``."""

    def __init__(self) -> None:
        from ray.util.metrics import Gauge, Histogram

        self._reservations = Gauge(
            "placectl_reservations", "Reservations by state.", tag_keys=("state",)
        )
        self._accelerators = Gauge(
            "placectl_reserved_accelerators", "Accelerators reserved per job.", tag_keys=("job",)
        )
        self._latency = Histogram(
            "placectl_reserve_latency_seconds",
            "Time to create, place and probe a new reservation.",
            boundaries=[0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
        )

    def observe(self, states: dict[str, int], accelerators: dict[str, int]) -> None:
        for state, n in states.items():
            self._reservations.set(n, tags={"state": state})
        for job, n in accelerators.items():
            self._accelerators.set(n, tags={"job": job})

    def forget(self, job: str) -> None:
        self._accelerators.set(0, tags={"job": job})

    def reserve_latency(self, seconds: float) -> None:
        self._latency.observe(seconds)
