"""The KubeRay manifest of docs/operations/raycluster.yaml against what placectl relies on.

KubeRay's CRD schema ships in no installable package, so the schema itself is not checked
here (docs/operations/kuberay.md says how it was checked); these are the facts placectl
needs from the cluster the manifest makes."""

from __future__ import annotations

import pathlib
import re

import yaml

from clients.versions import MIN_RAY
from controller.state.spares import KIND_LABELS

MANIFEST = pathlib.Path(__file__).resolve().parents[2] / "docs" / "operations" / "raycluster.yaml"


def cluster() -> dict:
    doc = yaml.safe_load(MANIFEST.read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayCluster")
    return doc["spec"]


def test_the_gcs_keeps_its_tables_in_redis_so_a_head_restart_keeps_every_reservation():
    ft = cluster()["gcsFaultToleranceOptions"]
    assert re.fullmatch(r"[\w.-]+:\d+", ft["redisAddress"])
    assert ft["redisPassword"]["valueFrom"]["secretKeyRef"]["name"]


def test_gpu_groups_scale_from_zero_on_the_demand_ray_reports():
    spec = cluster()
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["version"] == "v2"
    for group in spec["workerGroupSpecs"]:
        assert group["minReplicas"] == 0 and group["replicas"] == 0
        assert group["maxReplicas"] > 0


def test_group_labels_are_kind_labels_a_spare_is_matched_on():
    for group in cluster()["workerGroupSpecs"]:
        for label in group.get("labels", {}):
            assert label in KIND_LABELS or not label.startswith("ray.io/"), label


def test_pods_outlive_rays_drain_so_the_job_can_move_its_ranks():
    for group in cluster()["workerGroupSpecs"]:
        grace = group["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace >= 30  # Ray's RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S default


def test_every_image_runs_a_ray_placectl_supports():
    spec = cluster()
    version = tuple(int(p) for p in spec["rayVersion"].split(".")[:2])
    assert version >= MIN_RAY
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            assert container["image"].endswith(spec["rayVersion"]), container["image"]
