"""The shipped alert rules (docs/operations/placectl-rules.yaml), loaded unchanged by a
real Prometheus server that scrapes a live cluster's metrics endpoint: quiet while the
job is whole, ``PlacectlReservationDegraded`` raised when a node dies without a word and
no spare can replace it, ``PlacectlControllerDown`` raised when the controller is gone
(its series must vanish from Ray's export for ``absent()`` to see it).

An alert with a ``for:`` shows as *pending* from its first true evaluation and as
*firing* once it has held that long (minutes); the pending state is what this test
waits for, since it proves the expression matches what a live cluster exports. The
``for:`` durations themselves are promtool's to test (tests/unit/test_metrics_rules.py).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
import yaml

import clients
from clients.testing.local import local_cluster
from tests.integration.conftest import placectl_cli as cli
from tests.integration.conftest import wait_for

RULES = pathlib.Path(__file__).resolve().parents[2] / "docs" / "operations" / "placectl-rules.yaml"
SPEC = {"num_nodes": 3, "component_placement": {"actor": "0-3"}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    return json.loads(urllib.request.urlopen(url, timeout=10).read().decode())


@pytest.fixture
def prometheus(tmp_path):
    """A Prometheus server scraping the head's metrics endpoint every second, with the
    shipped rules evaluated every second; yields (its API's base URL, the metrics port)."""
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.skip("no prometheus server here (Debian's package `prometheus` has it)")
    metrics, web = _free_port(), _free_port()
    # The shipped file is a PrometheusRule (the Prometheus Operator's resource); a bare
    # server reads its groups, unchanged, as the operator hands them over.
    rule, _monitor = yaml.safe_load_all(RULES.read_text())
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{str(tmp_path / 'rules.yaml')!r}]\n"
        "scrape_configs:\n"
        f"  - {{job_name: ray, static_configs: [{{targets: ['127.0.0.1:{metrics}']}}]}}\n"
    )
    argv = [
        exe,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{web}",
    ]
    log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115 (closed below)
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{web}"
    try:

        def ready() -> bool:
            try:
                return urllib.request.urlopen(f"{base}/-/ready", timeout=2).status == 200
            except OSError:
                return False

        wait_for(ready, timeout=60, interval=0.5)
        yield base, metrics
    finally:
        server.terminate()
        server.wait(30)
        log.close()


def _alerts(base: str) -> dict[str, str]:
    """Each placectl alert Prometheus holds now -> its state (pending, firing)."""
    got = _get(f"{base}/api/v1/alerts")["data"]["alerts"]
    return {a["labels"]["alertname"]: a["state"] for a in got}


def _query(base: str, expr: str) -> list:
    return _get(f"{base}/api/v1/query?query={urllib.parse.quote(expr)}")["data"]["result"]


def test_a_prometheus_server_raises_the_shipped_alerts_on_real_faults(prometheus):
    base, port = prometheus
    head = {
        "num_cpus": 2,
        "num_gpus": 0,
        "metrics_export_port": port,
        "_system_config": {"metrics_report_interval_ms": 1000},
    }
    with local_cluster(2, gpus=2, head=head) as (cluster, nodes):
        ctl = clients.connect()
        res = ctl.reserve("prom", SPEC, timeout_s=120)  # every GPU: no spare
        # Quiet while the job is whole: Prometheus reads the reservation, no alert.
        wait_for(lambda: _query(base, 'ray_placectl_reservations{state="ready"} > 0'), 90, 1.0)
        wait_for(lambda: _query(base, "ray_placectl_table_readable == 1"), 60, 1.0)
        time.sleep(3)  # three evaluations over live series
        assert _alerts(base) == {}, _alerts(base)

        lost = res.info.slots[0].node_id
        cluster.remove_node(next(n for n in nodes if n.node_id == lost), allow_graceful=False)
        wait_for(lambda: ctl.status("prom").state == "degraded", timeout=120)
        wait_for(lambda: "PlacectlReservationDegraded" in _alerts(base), timeout=90)
        assert _alerts(base)["PlacectlReservationDegraded"] == "pending"  # for: 5m
        assert "PlacectlControllerDown" not in _alerts(base)

        ctl.release("prom")
        stopped = cli(cluster.address, "stop")
        assert stopped.returncode == 0, stopped.stderr
        # The controller's series leave Ray's export, and absent() sees it.
        wait_for(lambda: "PlacectlControllerDown" in _alerts(base), timeout=180, interval=2)
        assert _alerts(base)["PlacectlControllerDown"] == "pending"  # for: 5m
