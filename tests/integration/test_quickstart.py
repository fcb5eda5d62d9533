"""The README's quickstart, run as written (all but `pip install`, which the test's
environment has done): a one-machine cluster started with `ray start`, the CLI, the
quickstart script. What its workers print is checked against what Ray says they hold."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def quickstart_block() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    after = readme.split("<!-- quickstart", 1)[1]
    block = re.search(r"```bash\n(.*?)```", after, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_the_readme_quickstart_runs_as_written():
    lines = quickstart_block()
    assert lines[0].startswith("ray start --head") and lines[-1] == "ray stop"
    bin_dir = os.path.dirname(sys.executable)  # the environment's placectl and ray
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    outputs = []
    try:
        for line in lines:
            if line.startswith("pip install"):
                continue
            done = subprocess.run(
                ["bash", "-c", line],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
            outputs.append((line.split("#")[0].strip(), done.stdout))
    finally:
        subprocess.run(["ray", "stop", "--force"], env=env, capture_output=True, check=False)
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
