"""The alert rules and the PodMonitor the metrics page ships, checked against the code and
the shipped RayCluster: every metric an expression names is one placectl exports, every
rule carries what Alertmanager routes on, the monitor scrapes a port the head declares;
and by Prometheus's own ``promtool`` (Debian's ``prometheus`` package, which
scripts/test installs as root): the rules load, and each alert fires on the series that
should make it fire and stays quiet on a healthy cluster's."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

from controller.runtime.edge.metrics import METRICS, exported

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "operations"
RULES, MONITOR = yaml.safe_load_all((DOCS / "placectl-rules.yaml").read_text())


def rules() -> list[dict]:
    return [r for g in RULES["spec"]["groups"] for r in g["rules"]]


def test_every_expression_names_only_exported_metrics_and_is_balanced():
    known = {exported(n) + s for n in METRICS for s in ("", "_bucket", "_sum", "_count")}
    for rule in rules():
        expr = rule["expr"]
        named = set(re.findall(r"ray_placectl_[a-z_]+", expr))
        assert named and named <= known, (rule["alert"], named - known)
        for a, b in ("()", "{}", "[]"):
            assert expr.count(a) == expr.count(b), rule["alert"]


def test_every_rule_can_be_routed_and_waits_a_valid_duration():
    names = [r["alert"] for r in rules()]
    assert len(names) == len(set(names))
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s")), rule["alert"]


def test_controller_down_and_table_unreadable_are_alerted_on():
    by_name = {r["alert"]: r["expr"] for r in rules()}
    assert by_name["PlacectlControllerDown"] == "absent(ray_placectl_table_readable)"
    assert by_name["PlacectlTableUnreadable"] == "ray_placectl_table_readable == 0"
    assert METRICS["placectl_table_readable"][0] == "gauge"


def test_the_pod_monitor_scrapes_the_port_the_shipped_head_declares():
    assert (RULES["kind"], MONITOR["kind"]) == ("PrometheusRule", "PodMonitor")
    cluster = yaml.safe_load((DOCS / "raycluster.yaml").read_text())
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    ports = {p["name"] for p in head["ports"]}
    (endpoint,) = MONITOR["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in ports
    assert MONITOR["spec"]["selector"]["matchLabels"] == {"ray.io/node-type": "head"}


# For each alert: the series that make it fire (Prometheus's expanding notation, one
# sample a minute), the labels it then carries beside its own, and when it is checked.
FIRING = {
    "PlacectlControllerDown": ({"up": "1x90"}, {}, "10m"),
    "PlacectlTableUnreadable": ({"ray_placectl_table_readable": "0x90"}, {}, "10m"),
    "PlacectlReservationDegraded": (
        {'ray_placectl_reservations{state="degraded"}': "1x90"},
        {"state": "degraded"},
        "10m",
    ),
    "PlacectlQueueStuck": (
        {'ray_placectl_queue_oldest_wait_seconds{queue="q"}': "2000x90"},
        {"queue": "q"},
        "10m",
    ),
    "PlacectlQueueAtQuota": (
        {
            'ray_placectl_quota_used{queue="q",resource="GPU"}': "8x90",
            'ray_placectl_quota_limit{queue="q",resource="GPU"}': "8x90",
        },
        {"queue": "q", "resource": "GPU"},
        "20m",
    ),
    "PlacectlRefusedOnSecuredCluster": (
        {'ray_placectl_fences_total{outcome="denied"}': "0+1x90"},
        {"outcome": "denied"},
        "30m",
    ),
    "PlacectlFencesFailing": (
        {'ray_placectl_fences_total{outcome="failed"}': "0+1x90"},
        {"outcome": "failed"},
        "30m",
    ),
    "PlacectlFencesWithheld": (
        {'ray_placectl_fences_total{outcome="withheld"}': "0+1x90"},
        {"outcome": "withheld"},
        "30m",
    ),
    "PlacectlRepairsFrequent": (
        {'ray_placectl_repairs_total{cause="node-lost"}': "0+1x90"},
        {"cause": "node-lost"},
        "60m",
    ),
}
# A healthy cluster: the controller up, nothing degraded or waiting long, quotas half
# used, nodes fenced now and then (not alerted on), nothing refused, failed or withheld.
QUIET = {
    "ray_placectl_table_readable": "1x90",
    'ray_placectl_reservations{state="degraded"}': "0x90",
    'ray_placectl_reservations{state="ready"}': "3x90",
    'ray_placectl_queue_oldest_wait_seconds{queue="q"}': "60x90",
    'ray_placectl_quota_used{queue="q",resource="GPU"}': "4x90",
    'ray_placectl_quota_limit{queue="q",resource="GPU"}': "8x90",
    'ray_placectl_fences_total{outcome="fenced"}': "0+0.05x90",
    'ray_placectl_fences_total{outcome="denied"}': "0x90",
    'ray_placectl_fences_total{outcome="failed"}': "0x90",
    'ray_placectl_fences_total{outcome="withheld"}': "0x90",
    'ray_placectl_repairs_total{cause="node-lost"}': "0+0.05x90",
}


def _rendered(text: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        why = "promtool is not installed (Debian: apt-get install prometheus)"
        if os.environ.get("PLACECTL_NO_SKIPS") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return found


def test_every_alert_has_series_that_make_it_fire():
    assert sorted(FIRING) == sorted(r["alert"] for r in rules())


def test_promtool_loads_the_rules_and_each_alert_fires_and_stays_quiet(tmp_path):
    promtool = _promtool()
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": RULES["spec"]["groups"]}))
    checked = subprocess.run(
        [promtool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tests = []
    for rule in rules():
        series, labels, at = FIRING[rule["alert"]]
        fired = {**rule["labels"], **labels}
        annotations = {k: _rendered(v, fired) for k, v in rule["annotations"].items()}
        expected = [{"exp_labels": fired, "exp_annotations": annotations}]
        tests.append(
            {
                "interval": "1m",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "alert_rule_test": [
                    {"eval_time": at, "alertname": rule["alert"], "exp_alerts": expected},
                    # and not at once: a rule with a `for` waits it out first
                    *(
                        [{"eval_time": "0m", "alertname": rule["alert"], "exp_alerts": []}]
                        if rule.get("for")
                        else []
                    ),
                ],
            }
        )
    tests.append(
        {
            "interval": "1m",
            "input_series": [{"series": k, "values": v} for k, v in QUIET.items()],
            "alert_rule_test": [
                {"eval_time": at, "alertname": r["alert"], "exp_alerts": []}
                for r in rules()
                for at in ("10m", "30m", "80m")
            ],
        }
    )
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "tests": tests}, sort_keys=False)
    )
    tested = subprocess.run(
        [promtool, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
