#!/usr/bin/env bash
# The main job end to end on a bundled default: synthesize a tiny GPT-OSS checkpoint (MXFP4
# experts, exact upstream layout), convert it to fp8-block and mxfp8, inspect both, shard the
# fp8-block one for 4 expert-parallel ranks (verified), and check the logits of both against
# transformers on the source (KL divergence, top-1 agreement, perplexity ratio).
# Usage: scripts/demo.sh [WORKDIR]   (default: ./demo-out, replaced on every run)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh eval,serve  # eval: transformers, the reference the last step compares against; serve: `quantkit serve`
out=${1:-demo-out}
rm -rf "$out"
mkdir -p "$out"
echo "== synth: tiny GPT-OSS (MXFP4 experts) -> $out/gpt-oss-tiny" >&2
quantkit synth gpt-oss "$out/gpt-oss-tiny" --preset tiny --seed 0
echo "== inspect the source" >&2
quantkit inspect "$out/gpt-oss-tiny"
for fmt in fp8-block mxfp8; do
  echo "== convert -> $fmt" >&2
  quantkit convert "$out/gpt-oss-tiny" "$out/gpt-oss-tiny-$fmt" --to "$fmt"
  quantkit inspect "$out/gpt-oss-tiny-$fmt"
done
echo "== shard fp8-block for EP 4 (verified)" >&2
quantkit shard "$out/gpt-oss-tiny-fp8-block" "$out/gpt-oss-tiny-fp8-block-ep4" --ep 4 --verify
echo "== eval accuracy against transformers on the source" >&2
quantkit eval accuracy "$out/gpt-oss-tiny-fp8-block" "$out/gpt-oss-tiny-mxfp8" \
  --reference "$out/gpt-oss-tiny" --tokens 1024 --ctx 256
