"""config.json as transformers 4.x and 5.x write it (tests/fixtures/configs/, see generate_v5.py there),
on the matching tiny weights: each is inspected, converted, sharded and served, and the two versions of
one model are read, and serve, alike.  transformers' own config classes judge what each file means."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from quantkit.cli import main
from quantkit.modelconfig import read

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
FAMILIES = ("qwen3", "qwen3-moe", "gpt-oss", "deepseek-v3")
VERSIONS = ("4.x", "5.x")
PROMPT = [5, 17, 300, 42]
TARGET = {"gpt-oss": "mxfp8"}  # the exact (fast) path from MXFP4; fp8-block for the others


def fixture(family: str, version: str) -> dict:
    return json.loads((FIXTURES / f"{family}-{version}.json").read_text())


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The synth tiny checkpoint of a family: the fixtures carry its dimensions."""
    from quantkit.synth import synthesize

    root, made = tmp_path_factory.mktemp("weights"), {}

    def get(family: str) -> Path:
        if family not in made:
            made[family] = root / family
            synthesize(family, made[family], preset="tiny")
        return made[family]
    return get


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("version", VERSIONS)
def test_transformers_reads_the_fixture_as_we_do(family: str, version: str) -> None:
    """The dimensions, as transformers' config class for the architecture resolves them."""
    import transformers

    cfg = fixture(family, version)
    mc = read(cfg)
    hf = getattr(transformers, cfg["architectures"][0].replace("ForCausalLM", "Config"))(**cfg)
    key = {"qwen3-moe": "num_experts", "gpt-oss": "num_local_experts", "deepseek-v3": "n_routed_experts"}.get(family)
    experts = getattr(hf, key) if key else 0
    head_dim = hf.qk_rope_head_dim if family == "deepseek-v3" else getattr(hf, "head_dim", hf.hidden_size // hf.num_attention_heads)
    assert (mc.hidden, mc.vocab, mc.layers, mc.heads, mc.kv_heads, mc.head_dim, mc.experts, mc.tied) == (
        hf.hidden_size, hf.vocab_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, head_dim,
        experts, hf.tie_word_embeddings)
    if experts:
        assert (mc.top_k, mc.moe_intermediate) == (hf.num_experts_per_tok, getattr(hf, "moe_intermediate_size", hf.intermediate_size))


@pytest.mark.parametrize("family", FAMILIES)
def test_both_versions_read_alike(family: str) -> None:
    old, new = (read(fixture(family, v)) for v in VERSIONS)
    assert old.raw != new.raw and replace(old, raw={}) == replace(new, raw={})


def _ok(args: list[str]) -> str:
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    return r.stdout


def _greedy(path: Path) -> list[int]:
    """A few greedy tokens from the serving engine (continuous-batching scheduler over the paged KV cache)."""
    from quantkit.engine import load
    from quantkit.serve.sampling import SamplingParams
    from quantkit.serve.scheduler import LLMEngine

    eng = LLMEngine(load(path, dtype=torch.float32), num_blocks=8, block_size=16)
    req = eng.add_request(PROMPT, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    eng.run_all()
    assert req.finish_reason == "length"
    return req.output


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only contend
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("family", FAMILIES)
def test_fixture_is_inspected_converted_sharded_and_served(family: str, weights, tmp_path: Path, one_thread) -> None:
    served, target = {}, TARGET.get(family, "fp8-block")
    for version in VERSIONS:
        src, out, ranks = (tmp_path / f"{version}-{x}" for x in ("src", "out", "ep2"))
        shutil.copytree(weights(family), src)
        (src / "config.json").write_text(json.dumps(fixture(family, version)))
        rep = json.loads(_ok(["inspect", str(src), "--json"]))
        assert rep["family"] == family and rep["problems"] == []
        _ok(["convert", str(src), str(out), "--to", target])
        rep = json.loads(_ok(["inspect", str(out), "--json"]))
        assert rep["problems"] == [] and target in rep["formats"], rep
        assert json.loads(_ok(["shard", str(out), str(ranks), "--ep", "2", "--verify", "--json"]))["verify"] is not None
        served[version] = _greedy(out)
    assert len(served["4.x"]) == 3 and served["4.x"] == served["5.x"], served
