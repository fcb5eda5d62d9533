# Sourced by scripts/test and scripts/demo: make sure .venv exists and holds the
# project with its test extra. Re-installs only when pyproject.toml changed.
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.placectl-installed
if [ ! -f "$stamp" ] || ! cmp -s pyproject.toml "$stamp"; then
  echo "== installing placectl and its test dependencies into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import controller, clients, ray, msgspec, yaml" || { echo "install failed" >&2; exit 1; }
  cp pyproject.toml "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
# RLinf's scheduler for tests/integration/test_rlinf.py: rlinf's own requirements pull about
# 3 GB (CUDA-free torch stack, liger_kernel, triton); its scheduler needs only omegaconf
# and antlr4 (both here already, through verl), so it goes in without them.
if ! .venv/bin/python -c "import rlinf.scheduler" >/dev/null 2>&1; then
  echo "== installing rlinf==0.3.0 (--no-deps) into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps rlinf==0.3.0 2>&1 | grep -v "^WARNING: Location" || true
fi
