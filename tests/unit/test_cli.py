"""``placectl plan``: the dry run a person reads, its JSON, and its one-line errors."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from clients.cli import main

EXAMPLES = pathlib.Path(__file__).parents[2] / "scripts" / "examples"


def run(capsys, *argv):
    code = 0
    try:
        main(list(argv))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_picture_rows_cells_and_summary(capsys):
    code, out, err = run(
        capsys, "plan", str(EXAMPLES / "colocated.yaml"), "--nodes", "2", "--gpus-per-node", "8"
    )
    assert code == 0, err
    lines = out.splitlines()
    header = next(line for line in lines if line.strip().startswith("GPU0"))
    assert header.split() == [f"GPU{g}" for g in range(8)]
    node0 = lines.index(next(line for line in lines if line.startswith("node 0")))
    # colocated processes stand together in one cell: actor, rollout, engine on GPU0
    assert lines[node0].split()[2] == "actor:0"
    assert lines[node0 + 1].split()[0] == "rollout:0"
    assert lines[node0 + 2].split()[:2] == ["engine:0", "engine:0"]
    summary = {
        line.split()[0]: line.split() for line in lines if line.startswith(("actor", "engine"))
    }
    assert summary["actor"][1:5] == ["cluster", "16", "0-1", "1/GPU"]
    assert summary["engine"][2] == "8" and summary["engine"][5:7] == ["2", "GPU"]
    assert summary["engine"][7] == "0.2"


def test_plan_json_matches_the_python_api(capsys):
    code, out, _ = run(
        capsys, "plan", str(EXAMPLES / "disaggregated.yaml"), "--gpus-per-node", "8", "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert list(data) == ["components"]
    assert list(data["components"]) == ["actor", "rollout", "reward"]
    rollout = data["components"]["rollout"]
    assert [p["cuda_visible_devices"] for p in rollout] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert {p["node_rank"] for p in rollout} == {1}
    assert set(rollout[0]) >= {
        "rank",
        "world_size",
        "component",
        "node_group",
        "node_rank",
        "node_id",
        "node_ip",
        "placement_node_rank",
        "resource_ranks",
        "local_resource_ranks",
        "local_gpu_id",
        "cuda_visible_devices",
        "isolate_gpu",
        "local_rank",
        "local_world_size",
    }


def test_plan_heterogeneous_cluster_file(capsys):
    code, out, err = run(
        capsys,
        "plan",
        str(EXAMPLES / "hetero_robot.yaml"),
        "--cluster",
        str(EXAMPLES / "hetero_nodes.yaml"),
    )
    assert code == 0, err
    assert "franka0" in out and "env:0-1" in out and "env:2-3" in out


def test_plan_large_cluster_elides_middle_nodes(capsys):
    conf = "cluster: {num_nodes: 64, component_placement: {actor: all}}"
    code, out, _ = run(capsys, "plan", conf, "--gpus-per-node", "8")
    assert code == 0
    assert "... 44 more nodes ..." in out
    assert "node 63" in out and "node 20" not in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["plan", "/nope.yaml", "--nodes", "1", "--gpus-per-node", "8"],
            "cannot read configuration",
        ),
        (
            [
                "plan",
                "cluster: {num_nodes: 1, component_placement: {a: 0-8}}",
                "--gpus-per-node",
                "8",
            ],
            "resource rank 8 in '0-8' is out of range (0-7)",
        ),
        (
            [
                "plan",
                "cluster: {num_nodes: 2, component_placement: {a: 0}}",
                "--nodes",
                "1",
                "--gpus-per-node",
                "8",
            ],
            "cluster.num_nodes is 2, but the cluster has 1 node",
        ),
        (
            ["plan", "cluster: {num_nodes: 1, component_placement: {a: 0}}"],
            "no Ray cluster is running to take the accelerators per node from",
        ),
        (
            [
                "plan",
                "cluster: {num_nodes: 1, component_placement: {a: 0}}",
                "--gpus-per-node",
                "x",
            ],
            "'x' is not a valid integer",
        ),
        (["plan"], "Missing argument 'CONFIG'"),
        (["bogus"], "No such command 'bogus'"),
    ],
)
def test_errors_are_one_line_exit_2(capsys, monkeypatch, argv, message):
    import clients.discovery

    monkeypatch.setattr(clients.discovery, "running_cluster_view", lambda accelerator: None)
    code, _out, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("placectl: error: ")
    assert message in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_plan_without_gpus_per_node_takes_them_from_a_running_cluster(capsys, monkeypatch):
    import clients.discovery
    from controller import ClusterView, NodeView

    seen = ClusterView(nodes=[NodeView(num_gpus=0, is_head=True), NodeView(num_gpus=4)])
    monkeypatch.setattr(clients.discovery, "running_cluster_view", lambda accelerator: seen)
    code, out, _ = run(capsys, "plan", "cluster: {num_nodes: 2, component_placement: {a: 0-3}}")
    assert code == 0 and "2 node(s), 4 GPU" in out


def test_console_script_end_to_end(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster:\n  num_nodes: 1\n  component_placement:\n    a: 4-5,0-1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "clients.cli", "plan", str(bad), "--gpus-per-node", "8"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith(
        "segments must be in ascending resource order, but '0-1' follows '4-5'"
    )
    assert proc.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ("nodes:\n  - {num_gpus: -1}\n", "nodes[0]: NodeView num_gpus -1: must be >= 0"),
        ("nodes:\n  - {num_gpus: 2, colour: red}\n", "nodes[0]: unknown key 'colour'"),
        ("nodes:\n  - {num_gpus: 2, count: -1}\n", "nodes[0].count -1: must be >= 0"),
        ("- 3\n", "nodes[0]: expected `object`, got `int`"),
    ],
)
def test_bad_cluster_file(capsys, tmp_path, nodes, message):
    f = tmp_path / "nodes.yaml"
    f.write_text(nodes)
    code, _, err = run(capsys, "plan", str(EXAMPLES / "colocated.yaml"), "--cluster", str(f))
    assert code == 2
    assert message in err and err.count("\n") == 1


@pytest.mark.may_skip
def test_gpu_check_says_when_there_is_no_gpu_to_check():
    import shutil

    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi: run scripts/gpu_check itself")
    root = pathlib.Path(__file__).resolve().parents[2]
    # This interpreter, not the checkout's .venv: the environment under test may be
    # another (CI runs these tests in one made from the dev extra alone).
    proc = subprocess.run(
        [str(root / "scripts" / "gpu_check")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no NVIDIA GPU to check on this machine" in proc.stdout


NVL_NODES = """
- {num_gpus: 4, labels: {ray.io/gpu-domain: A, placectl.io/rack: r1}, count: 2}
- {num_gpus: 4, labels: {ray.io/gpu-domain: B}, count: 2}
"""


def test_plan_shows_each_nodes_domain_and_refuses_a_spanning_segment(capsys, tmp_path):
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(NVL_NODES)
    conf = tmp_path / "conf.yaml"
    conf.write_text(
        "cluster:\n  num_nodes: 4\n  component_placement:\n"
        "    actor: {placement: 0-7, topology: {segment: 8}}\n    rollout: 8-15\n"
    )
    code, out, err = run(capsys, "plan", str(conf), "--cluster", str(nodes))
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.startswith("node ")]
    assert rows[0].startswith("node 0 domain=A rack=r1") and "actor:0" in rows[0]
    assert rows[2].startswith("node 2 domain=B") and "rollout:0" in rows[2]
    conf.write_text(
        conf.read_text()
        .replace("0-7, topology: {segment: 8}", "4-11, topology: {segment: 8}")
        .replace("8-15", "12-15")
    )
    code, _, err = run(capsys, "plan", str(conf), "--cluster", str(nodes))
    assert code == 2 and err.count("\n") == 1
    assert (
        "processes 0-7 (topology.segment 8) span NVLink domains A (node rank 1), B (node rank 2)"
        in err
    )


def test_every_error_has_the_exit_code_the_reference_documents():
    from clients import exit_codes
    from controller import errors

    assert exit_codes.code_of(errors.UnknownReservation("x")) == 3
    for conflict in (errors.ReservationConflict, errors.NotOwner, errors.StaleReservation):
        assert exit_codes.code_of(conflict("x")) == 4
    assert exit_codes.code_of(errors.ReservationTimeout("x")) == 5
    for gone in (errors.ClusterUnavailable, errors.TableUnreadable, errors.PersistenceError):
        assert exit_codes.code_of(gone("x")) == 6
    for bad in (errors.SpecError, errors.PlacementStringError, errors.ReservationInfeasible):
        assert exit_codes.code_of(bad("x")) == 2
    assert exit_codes.code_of(ConnectionError("x")) == 6
    assert exit_codes.code_of(KeyboardInterrupt()) == 130
    assert exit_codes.code_of(RuntimeError("x")) == 1


def test_a_bad_configuration_exits_2_with_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster:\n  num_nodes: 2\n  component_placement:\n    actor: 4-1\n")
    code, _, err = run(capsys, "plan", str(bad), "--gpus-per-node", "8")
    assert code == 2 and err.count("\n") == 1 and "4-1" in err


def test_plan_yaml_is_the_same_document_as_its_json(capsys):
    import yaml

    args = ("plan", str(EXAMPLES / "disaggregated.yaml"), "--gpus-per-node", "8")
    _, as_json, _ = run(capsys, *args, "-o", "json")
    code, as_yaml, err = run(capsys, *args, "-o", "yaml")
    assert code == 0, err
    assert yaml.safe_load(as_yaml) == json.loads(as_json)


def test_an_unknown_output_format_is_refused_with_the_allowed_ones(capsys):
    code, _, err = run(capsys, "plan", str(EXAMPLES / "colocated.yaml"), "-o", "xml")
    assert code == 2 and "'xml' is not one of 'table', 'json', 'yaml'" in err


def test_watch_redraws_a_terminal_and_appends_when_piped(monkeypatch, capsys):
    from clients.cli import app

    frames = iter(["one", "one", "two"])

    def show():
        try:
            return next(frames)
        except StopIteration:
            raise KeyboardInterrupt from None  # Ctrl-C ends a watch without an error

    monkeypatch.setattr(app.time, "sleep", lambda s: None)
    monkeypatch.setattr(app.sys.stdout, "isatty", lambda: True)
    app.watch(show, 1.0, "table")
    out = capsys.readouterr().out
    assert out.count("\x1b[2J") == 2 and out.count("Ctrl-C ends") == 2  # drawn twice
    frames = iter(['{"a": 1}', '{"a": 2}'])
    app.watch(show, 1.0, "json")
    assert capsys.readouterr().out.splitlines() == ['{"a": 1}', '{"a": 2}']  # one per line


def test_plan_says_when_num_nodes_counts_a_head_no_process_uses(capsys, tmp_path):
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("- {num_gpus: 0, is_head: true}\n- {num_gpus: 4, count: 2}\n")
    conf = tmp_path / "conf.yaml"
    conf.write_text("cluster:\n  num_nodes: 3\n  component_placement:\n    actor: 0-7\n")
    code, _, err = run(capsys, "plan", str(conf), "--cluster", str(nodes))
    assert code == 0, err
    assert "node rank 0 is the Ray head" in err and "num_nodes counts it" in err
    conf.write_text(
        "cluster:\n  num_nodes: 3\n  component_placement:\n    actor: 0-7\n"
        "    reward: {node_group: node, placement: '0'}\n"
    )
    code, _, err = run(capsys, "plan", str(conf), "--cluster", str(nodes))
    assert code == 0, err
    assert "Ray head" not in err  # the reward process uses the head
