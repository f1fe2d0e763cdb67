"""Synthetic sources for the shard tests: ``quantkit synth`` tiny presets and their ``quantkit convert`` outputs.

Built once for the shard tests and removed after them (converting the tiny GPT-OSS takes a few seconds); sources are
written in several safetensors files so sharding reads across files.
"""

from __future__ import annotations

import shutil

import pytest

from quantkit.checkpoint import Checkpoint

FAMILIES = ("gpt-oss", "deepseek-v3", "qwen3", "qwen3-moe")
TARGETS = ("fp8-block", "mxfp8", "bf16")
FORMATS = ("source", *TARGETS)  # "source": what the family ships (MXFP4 / FP8-block / BF16)


@pytest.fixture(scope="package")
def synth_ckpt(tmp_path_factory):
    """(family, fmt, preset) -> Checkpoint of the synthetic tiny model, converted to ``fmt`` when not "source"."""
    from quantkit.converters import ConvertOptions, convert
    from quantkit.synth import synthesize

    root = tmp_path_factory.mktemp("synth")
    cache: dict[tuple[str, str, str], Checkpoint] = {}

    def get(family: str, fmt: str = "source", preset: str = "tiny") -> Checkpoint:
        key = (family, fmt, preset)
        if key not in cache:
            src = root / f"{family}-{preset}"
            if not src.exists():
                synthesize(family, src, preset=preset, max_shard_size="1MB")
            path = src
            if fmt != "source":
                path = root / f"{family}-{preset}-{fmt}"
                convert(src, path, ConvertOptions(to=fmt, max_shard_size=1_000_000))
            cache[key] = Checkpoint(path)
        return cache[key]

    yield get
    shutil.rmtree(root, ignore_errors=True)
