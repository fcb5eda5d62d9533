# Sourced by scripts/test and scripts/demo: make sure .venv exists and holds the project
# with the extras the caller needs (PLACECTL_EXTRAS: `demo`, `dev` or, by default, `test`,
# which holds both and the framework integrations' packages). Installs again only when
# pyproject.toml changed since those extras were installed.
PYTHON=${PYTHON:-python3}
EXTRAS=${PLACECTL_EXTRAS:-test}
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PYTHON" -m venv .venv
fi
installed() {  # the extras $1, or `test` (which holds every other), are installed for this pyproject
  for e in "$1" test; do
    if [ -f ".venv/.placectl-$e" ] && cmp -s pyproject.toml ".venv/.placectl-$e"; then return 0; fi
  done
  return 1
}
if ! installed "$EXTRAS"; then
  echo "== installing placectl[$EXTRAS] into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$EXTRAS]" 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import controller, clients, ray, msgspec, yaml" || { echo "install failed" >&2; exit 1; }
  cp pyproject.toml ".venv/.placectl-$EXTRAS"
fi
export PATH="$PWD/.venv/bin:$PATH"
[ "$EXTRAS" = test ] || return 0
# RLinf's scheduler for tests/integration/test_rlinf.py: rlinf's own requirements pull about
# 3 GB (CUDA-free torch stack, liger_kernel, triton); its scheduler needs only omegaconf
# and antlr4 (both here already, through verl), so it goes in without them.
if ! .venv/bin/python -c "import rlinf.scheduler" >/dev/null 2>&1; then
  echo "== installing rlinf==0.3.0 (--no-deps) into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps rlinf==0.3.0 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import rlinf.scheduler" >/dev/null 2>&1 || { echo "rlinf install failed" >&2; exit 1; }
fi
# OpenRLHF for tests/integration/test_openrlhf.py: openrlhf 0.11.2 pins ray 2.55 and
# transformers 5.15, so it cannot resolve beside verl and goes in without its requirements.
# Its launcher imports deepspeed (built here without ops, against the CPU torch already
# installed, hence no build isolation), transformers, peft and torchdata (through verl),
# and vllm and flash_attn, which the test stands in for (tests/integration/openrlhf_site).
has_openrlhf='import importlib.util as u, sys; sys.exit(not (u.find_spec("openrlhf") and u.find_spec("deepspeed")))'
if ! .venv/bin/python -c "$has_openrlhf"; then
  echo "== installing openrlhf==0.11.2 (--no-deps) and deepspeed==0.19.6 into .venv"
  DS_BUILD_OPS=0 .venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation deepspeed==0.19.6 2>&1 | grep -v -e "^WARNING: Location" -e "dependency resolver" -e "^rlinf 0.3.0 requires" || true
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps openrlhf==0.11.2 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "$has_openrlhf" || { echo "openrlhf/deepspeed install failed" >&2; exit 1; }
fi
