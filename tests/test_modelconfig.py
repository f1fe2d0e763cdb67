"""One reading of config.json (quantkit.modelconfig) and its check against the tensors (quantkit.modelshapes).

The keys each family accepts are judged by transformers' own config classes; the corpus of bad
configs is made from tiny synth checkpoints, and every command that reads a checkpoint (inspect,
convert, shard, the engine loader behind serve and eval) must refuse each one with one line."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from quantkit.checkpoint import CheckpointError
from quantkit.cli import main
from quantkit.modelconfig import KEYS, read
from quantkit.synth import plan, synthesize

FAMILIES = ("qwen3", "qwen3-moe", "gpt-oss", "deepseek-v3")
CONFIG_CLASSES = {"qwen3-moe": "Qwen3MoeConfig", "gpt-oss": "GptOssConfig", "deepseek-v3": "DeepseekV3Config"}


@pytest.mark.parametrize("family", sorted(CONFIG_CLASSES))
def test_expert_keys_are_those_transformers_maps(family: str) -> None:
    """transformers' config class (with its attribute_map) reads every key quantkit reads as the expert count."""
    import transformers

    cls = getattr(transformers, CONFIG_CLASSES[family])
    keys = KEYS["experts"][family]
    for key in keys:
        c = cls(**{key: 6})
        assert all(getattr(c, k) == 6 for k in keys), (key, {k: getattr(c, k) for k in keys})


def _cfg(family: str, **edit: object) -> dict:
    cfg = dict(plan(family).config)
    for k, v in edit.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


@pytest.mark.parametrize("family, drop, key, value", [
    ("qwen3-moe", "num_experts", "num_local_experts", 8),  # transformers 5.x
    ("gpt-oss", "num_local_experts", "num_experts", 8),
    ("deepseek-v3", "n_routed_experts", "num_local_experts", 8),
    ("gpt-oss", "num_experts_per_tok", "experts_per_token", 4),  # openai's own key
    ("deepseek-v3", "num_nextn_predict_layers", "num_mtp_layers", 1),
])
def test_either_key_is_read(family: str, drop: str, key: str, value: int) -> None:
    def meaning(cfg: dict):
        return replace(read(cfg), raw={})

    # the other key alone, and both keys agreeing: the same reading as the canonical key alone
    assert meaning(_cfg(family, **{drop: None, key: value})) == meaning(_cfg(family)) == meaning(_cfg(family, **{key: value}))


@pytest.mark.parametrize("family, a, b", [
    ("qwen3-moe", "num_experts", "num_local_experts"),
    ("gpt-oss", "num_local_experts", "num_experts"),
    ("deepseek-v3", "n_routed_experts", "num_local_experts"),
    ("gpt-oss", "num_experts_per_tok", "experts_per_token"),
])
def test_both_keys_disagreeing_are_refused(family: str, a: str, b: str) -> None:
    cfg = _cfg(family)
    with pytest.raises(CheckpointError, match=rf"{a} = {cfg[a]} and {b} = {cfg[a] * 2} disagree"):
        read(_cfg(family, **{b: cfg[a] * 2}))


def test_a_key_transformers_does_not_map_is_not_read() -> None:
    """Qwen3-MoE has no n_routed_experts: transformers ignores it, and so does quantkit (the count is missing)."""
    with pytest.raises(CheckpointError, match="num_experts / num_local_experts is missing"):
        read(_cfg("qwen3-moe", num_experts=None, n_routed_experts=8))


# ----------------------------------------------------------- the corpus: bad configs of real tiny checkpoints

@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    root = tmp_path_factory.mktemp("tiny")
    made: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in made:
            made[family] = synthesize(family, root / family, preset="tiny") and root / family
        return made[family]
    return get


# (case id, family, config edit, the rule each command's message states)
CASES = [
    ("hidden-doubled", "qwen3", {"hidden_size": 512}, r"tensor 'model.embed_tokens.weight' has shape \[2048, 256\]; the config implies \[2048, 512\]"),
    ("hidden-zero", "qwen3", {"hidden_size": 0}, "hidden_size = 0 must be an integer >= 1"),
    ("hidden-string", "qwen3", {"hidden_size": "256"}, "hidden_size = '256' must be an integer >= 1"),
    ("hidden-float", "qwen3", {"hidden_size": 256.0}, "hidden_size = 256.0 must be an integer >= 1"),
    ("layers-one-more", "qwen3", {"num_hidden_layers": 3}, r"layers 0..1 \(2\) in the tensors, but the config says 3"),
    ("layers-one-more-mtp", "deepseek-v3", {"num_hidden_layers": 3}, r"tensor 'model.layers.2.embed_tokens.weight' is not one the config implies"),
    ("layers-one-fewer", "qwen3-moe", {"num_hidden_layers": 1}, r"layers 0..1 \(2\) in the tensors, but the config says 1"),
    ("vocab", "gpt-oss", {"vocab_size": 4096}, r"the config implies \[4096, 256\]"),
    ("experts-16", "qwen3-moe", {"num_experts": 16}, r"mlp.gate.weight' has shape \[8, 256\]; the config implies \[16, 256\]"),
    ("experts-4", "gpt-oss", {"num_local_experts": 4}, r"mlp.router.weight' has shape \[8, 256\]; the config implies \[4, 256\]"),
    ("experts-keys-disagree", "qwen3-moe", {"num_local_experts": 16}, "num_experts = 8 and num_local_experts = 16 disagree"),
    ("experts-missing", "qwen3-moe", {"num_experts": None}, "num_experts / num_local_experts is missing"),
    ("top-k-above-experts", "qwen3-moe", {"num_experts_per_tok": 9}, "num_experts_per_tok = 9 exceeds the 8 routed experts"),
    ("top-k-above-experts-gpt-oss", "gpt-oss", {"num_experts_per_tok": 9, "experts_per_token": 9}, "num_experts_per_tok = 9 exceeds the 8"),
    ("top-k-zero", "deepseek-v3", {"num_experts_per_tok": 0}, "num_experts_per_tok = 0 must be an integer >= 1"),
    ("kv-heads-not-dividing", "qwen3", {"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ("head-dim", "qwen3-moe", {"head_dim": 64}, r"q_proj.weight' has shape \[512, 256\]; the config implies \[256, 256\]"),
    ("moe-intermediate", "deepseek-v3", {"moe_intermediate_size": 256}, r"experts.0.gate_proj.weight' has shape \[128, 256\]; the config implies \[256, 256\]"),
    ("gpt-oss-intermediate", "gpt-oss", {"intermediate_size": 128}, r"experts.gate_up_proj' has shape \[8, 512, 256\]; the config implies \[8, 256, 256\]"),
    ("kv-lora", "deepseek-v3", {"kv_lora_rank": 256}, r"kv_a_proj_with_mqa.weight' has shape \[256, 256\]; the config implies \[384, 256\]"),
    ("mtp-missing-from-config", "deepseek-v3", {"num_nextn_predict_layers": 0}, r"layers 0..2 \(3\) in the tensors, but the config says 2"),
    ("dense-first-k", "deepseek-v3", {"first_k_dense_replace": 0}, r"model.layers.0.mlp.gate.weight' is missing"),
    ("n-group", "deepseek-v3", {"n_group": 3}, "n_group 3 must divide the 8 experts"),
    ("mlp-only-layers", "qwen3-moe", {"mlp_only_layers": [5]}, r"mlp_only_layers = \[5\] must be a list of layer indices in \[0, 2\)"),
    ("tie-string", "qwen3", {"tie_word_embeddings": "no"}, "tie_word_embeddings = 'no' must be true or false"),
    ("q-lora-missing", "deepseek-v3", {"q_lora_rank": None}, "q_lora_rank is missing"),
]


@pytest.fixture(params=CASES, ids=[c[0] for c in CASES])
def bad(request: pytest.FixtureRequest, tiny, tmp_path: Path) -> tuple[Path, str]:
    _, family, edit, rule = request.param
    src = tmp_path / "src"
    shutil.copytree(tiny(family), src)
    cfg = json.loads((src / "config.json").read_text())
    for k, v in edit.items():
        if v is None:
            del cfg[k]
        else:
            cfg[k] = v
    (src / "config.json").write_text(json.dumps(cfg))
    return src, rule


def test_inspect_reports_it(bad: tuple[Path, str]) -> None:
    src, rule = bad
    r = CliRunner().invoke(main, ["inspect", str(src), "--json"])
    assert r.exit_code == 1, r.output
    problems = json.loads(r.output)["problems"]
    assert any(re.search(rule, p) for p in problems), problems


def test_convert_and_shard_refuse_it(bad: tuple[Path, str], tmp_path: Path) -> None:
    src, rule = bad
    for cmd, dst in (("convert", tmp_path / "fp8"), ("shard", tmp_path / "ep2")):
        args = [cmd, str(src), str(dst), *(["--to", "fp8-block"] if cmd == "convert" else ["--ep", "2"])]
        r = CliRunner().invoke(main, args)
        lines = r.output.strip().splitlines()
        assert r.exit_code != 0 and len(lines) == 1 and lines[0].startswith("Error: ") and "config.json" in lines[0], r.output
        assert re.search(rule, lines[0]), lines[0]
        assert not dst.exists() and not (dst.parent / f".{dst.name}.quantkit-partial").exists()


def test_engine_refuses_it(bad: tuple[Path, str]) -> None:
    """serve and eval load through the engine loader."""
    from quantkit.engine.loader import load

    src, rule = bad
    with pytest.raises(CheckpointError, match=rule):
        load(src)


def test_eval_refuses_a_candidate_of_another_shape(tiny, tmp_path: Path) -> None:
    """eval compares what the configs mean, not their keys: a 5.x-keyed copy is the same model, a resized one is not."""
    from quantkit.eval.accuracy import check_compatible

    ref = tiny("qwen3-moe")
    same = shutil.copytree(ref, tmp_path / "same")
    cfg = json.loads((same / "config.json").read_text())
    cfg["num_local_experts"] = cfg.pop("num_experts")
    (same / "config.json").write_text(json.dumps(cfg))
    assert check_compatible(str(ref), [str(same)]).experts == 8
    other = tiny("qwen3")
    with pytest.raises(ValueError, match="is not the reference's model: family 'qwen3' vs 'qwen3-moe'"):
        check_compatible(str(ref), [str(other)])
