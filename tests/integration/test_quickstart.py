"""The README's quickstart, run as written (all but `pip install`, which the test's
environment has done): a one-machine cluster started with `ray start`, the CLI, the
quickstart script. What its workers print is checked against what Ray says they hold.

The block ends with `ray stop`, which stops every Ray process it can see, and starts its
cluster on Ray's default ports and session directory. So it runs in namespaces of its own
(Linux's ``unshare``): its own process table (`ray stop` sees only the block's
processes, and all of them end with it), its own loopback network (ports free whatever
else runs Ray here) and its own ``/tmp/ray`` (where `address="auto"` looks). Other Ray
clusters on the machine, a developer's or another test run's, are never touched."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Runs each line of the file $1 in order, in the namespaces unshare made; line N's
# output goes to $2/N.out, its exit code to $2/N.rc; stops at the first failure.
RUNNER = """
set -u
ip link set lo up
mkdir -p /tmp/ray && mount -t tmpfs placectl-quickstart /tmp/ray
n=0
while IFS= read -r line; do
  bash -c "$line" >"$2/$n.out" 2>"$2/$n.err" </dev/null
  rc=$?
  echo $rc >"$2/$n.rc"
  [ $rc = 0 ] || exit $rc
  n=$((n + 1))
done <"$1"
"""


def isolated() -> list[str]:
    """The ``unshare`` command that gives the block its own processes, network and
    mounts (as root, or mapped to root in a user namespace)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs Linux's unshare and ip (util-linux, iproute2) to isolate the block")
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--mount", "--net"]
    cmd += ["--propagation", "private"]
    if os.geteuid() != 0:
        cmd.insert(1, "--map-root-user")
    probe = subprocess.run([*cmd, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"this machine refuses namespaces: {probe.stderr.strip()}")
    return cmd


def quickstart_block() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    after = readme.split("<!-- quickstart", 1)[1]
    block = re.search(r"```bash\n(.*?)```", after, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_the_readme_quickstart_runs_as_written(tmp_path):
    lines = [line for line in quickstart_block() if not line.startswith("pip install")]
    assert lines[0].startswith("ray start --head") and lines[-1] == "ray stop"
    bin_dir = os.path.dirname(sys.executable)  # the environment's placectl and ray
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    (tmp_path / "block").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [*isolated(), "bash", "-c", RUNNER, "runner", str(tmp_path / "block"), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    outputs = []
    for n, line in enumerate(lines):
        rc = out / f"{n}.rc"
        said = (out / f"{n}.out").read_text() if rc.exists() else ""
        err = (out / f"{n}.err").read_text() if rc.exists() else done.stderr
        assert rc.exists() and rc.read_text().strip() == "0", f"{line}\n{said}\n{err}"
        outputs.append((line.split("#")[0].strip(), said))
    assert done.returncode == 0, done.stderr
    shown = dict(outputs)
    assert "demo: ready" in shown["placectl status demo"]
    hello = next(out for line, out in outputs if "quickstart.py" in line).splitlines()
    assert len(hello) == 2
    gpus = []
    for rank, said in enumerate(hello):
        m = re.match(
            r"rank (\d) of 2: LOCAL_RANK=0 CUDA_VISIBLE_DEVICES=(\d) MASTER=\S+:\d+; "
            r"Ray gave it GPU \[(\d)\]",
            said,
        )
        assert m, said
        assert int(m.group(1)) == rank
        assert m.group(2) == m.group(3)  # the device it sees is the one Ray granted
        gpus.append(m.group(3))
    assert gpus == ["0", "1"]  # actor: 0-1 in scripts/examples/quickstart.yaml
