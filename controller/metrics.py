"""The controller's metrics, exported through Ray's metrics system (Prometheus)."""

from __future__ import annotations


class ControllerMetrics:
    """Reservations by state, reserved accelerators per job, reserve latency."""

    STATES = ("pending", "ready", "degraded", "releasing")

    def __init__(self) -> None:
        from ray.util.metrics import Gauge, Histogram

        self.reservations = Gauge(
            "placectl_reservations", "Reservations by state.", tag_keys=("state",)
        )
        self.accelerators = Gauge(
            "placectl_reserved_accelerators", "Accelerators reserved per job.", tag_keys=("job",)
        )
        self.latency = Histogram(
            "placectl_reserve_latency_seconds",
            "Time to create, place and probe a new reservation.",
            boundaries=[0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
        )

    def observe(self, reservations: dict) -> None:
        counts = dict.fromkeys(self.STATES, 0)
        for res in reservations.values():
            counts[res.state] = counts.get(res.state, 0) + 1
            self.accelerators.set(res.accelerators(), tags={"job": res.job})
        for state, n in counts.items():
            self.reservations.set(n, tags={"state": state})

    def forget(self, job: str) -> None:
        self.accelerators.set(0, tags={"job": job})
