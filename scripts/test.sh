#!/usr/bin/env bash
# Installs quantkit with its test extras into .venv (CPU torch) and runs the test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -m gpu  or  scripts/test.sh tests/formats
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
# torch 2.13.0 CPU first: a plain `torch` requirement would pull a multi-GB CUDA build
python -m pip install -q --disable-pip-version-check "torch==2.13.0" || python -m pip install -q --disable-pip-version-check "torch>=2.11"
python -m pip install -q --disable-pip-version-check -e ".[test]"
exec python -m pytest -q "$@"
