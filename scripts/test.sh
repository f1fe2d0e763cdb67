#!/usr/bin/env bash
# Installs quantkit with its test extras into .venv (CPU torch) and runs the test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -m gpu  or  scripts/test.sh tests/formats
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh test
exec python -m pytest -q "$@"
