#!/usr/bin/env bash
# The main job end to end on a bundled default: synthesize a tiny GPT-OSS checkpoint (MXFP4
# experts, exact upstream layout), inspect it, and print the reports.
# Usage: scripts/demo.sh [WORKDIR]   (default: ./demo-out, replaced on every run)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --disable-pip-version-check "torch==2.13.0" || python -m pip install -q --disable-pip-version-check "torch>=2.11"
python -m pip install -q --disable-pip-version-check -e .
out=${1:-demo-out}
rm -rf "$out"
mkdir -p "$out"
echo "== synth: tiny GPT-OSS (MXFP4 experts) -> $out/gpt-oss-tiny" >&2
quantkit synth gpt-oss "$out/gpt-oss-tiny" --preset tiny --seed 0
echo "== inspect" >&2
quantkit inspect "$out/gpt-oss-tiny"
