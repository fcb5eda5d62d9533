"""The alert rules and the PodMonitor the metrics page ships, checked against the code and
the shipped RayCluster: every metric an expression names is one placectl exports, every
rule carries what Alertmanager routes on, the monitor scrapes a port the head declares.
A schema check: promtool is not installable from the registries CI reaches."""

from __future__ import annotations

import pathlib
import re

import yaml

from controller.runtime.metrics import METRICS, exported

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
