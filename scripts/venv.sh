# Sourced by scripts/demo.sh and scripts/test.sh from the project root: `. scripts/venv.sh EXTRAS`.
# Creates ./.venv (with $PYTHON, default python3) if missing, activates it, installs CPU torch and
# then quantkit in editable mode with the given extras. No pip cache: a runner's disk may be nearly full.
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
# torch 2.13.0 CPU first: a plain `torch` requirement would pull a multi-GB CUDA build
python -m pip install -q --disable-pip-version-check --no-cache-dir "torch==2.13.0" || python -m pip install -q --disable-pip-version-check --no-cache-dir "torch>=2.11"
python -m pip install -q --disable-pip-version-check --no-cache-dir -e ".[$1]"
