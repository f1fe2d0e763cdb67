"""A synthetic checkpoint is streamed: peak memory follows the largest tensor, not the model size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from quantkit.synth import plan

CODE = """
import json, resource, sys
from quantkit.synth import synthesize
rep = synthesize("qwen3-moe", sys.argv[1], preset="qwen3-30b-a3b", layers=2, max_shard_size="1GB")
rep["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(rep))
"""


@pytest.mark.slow
def test_peak_memory_is_bounded_by_the_largest_tensor(tmp_path: Path) -> None:
    specs = plan("qwen3-moe", "qwen3-30b-a3b", layers=2).specs
    largest, total = max(s.nbytes for s in specs), sum(s.nbytes for s in specs)
    out = subprocess.run([sys.executable, "-c", CODE, str(tmp_path / "q")], capture_output=True, text=True, check=True)
    rep = json.loads(out.stdout.strip().splitlines()[-1])
    assert rep["bytes"] == total > 5 * largest
    # the tensor being written + the one generated ahead + chunk buffers + the interpreter and torch
    bound = 2 * largest + 1.0e9
    assert rep["peak_rss"] < bound, f"peak RSS {rep['peak_rss'] / 1e9:.2f} GB for {total / 1e9:.2f} GB written, largest tensor {largest / 1e9:.2f} GB"
