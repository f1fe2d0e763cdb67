"""Tokenizers: the families' special tokens at the released tokenizers' ids (full-size presets),
in the same order at the top of a small vocabulary (tiny presets); any text round-trips."""

from __future__ import annotations

import pytest

from quantkit.synth import deepseek, gpt_oss, presets, qwen3
from quantkit.synth.tokenizer import build

# ids as in openai/gpt-oss (o200k_harmony), deepseek-ai/DeepSeek-V3(.1), Qwen/Qwen3 tokenizer.json
REAL_IDS = {
    ("gpt-oss", "gpt-oss-20b"): {"<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002,
                                 "<|constrain|>": 200003, "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007,
                                 "<|message|>": 200008, "<|call|>": 200012, "<|endofprompt|>": 200018,
                                 "<|reserved_200013|>": 200013, "<|reserved_201087|>": 201087},
    ("deepseek-v3", "deepseek-v3"): {"<｜begin▁of▁sentence｜>": 0, "<｜end▁of▁sentence｜>": 1, "<｜▁pad▁｜>": 2,
                                     "<｜place▁holder▁no▁0｜>": 128000, "<think>": 128798, "</think>": 128799,
                                     "<｜User｜>": 128803, "<｜Assistant｜>": 128804, "<｜tool▁sep｜>": 128814},
    ("qwen3", "qwen3-8b"): {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                            "<tool_call>": 151657, "<think>": 151667, "</think>": 151668},
}
SPEC = {"gpt-oss": gpt_oss.tokenizer, "deepseek-v3": deepseek.tokenizer, "qwen3": qwen3.tokenizer}
SIZE = {"gpt-oss": 201088, "deepseek-v3": 128815, "qwen3": 151669}


@pytest.mark.parametrize(("family", "preset"), list(REAL_IDS), ids=[k[0] for k in REAL_IDS])
def test_full_size_specials_at_real_ids(family: str, preset: str) -> None:
    tok = build(SPEC[family](presets.dims(family, preset, None)))
    assert tok.get_vocab_size() == SIZE[family]
    for s, i in REAL_IDS[(family, preset)].items():
        assert tok.token_to_id(s) == i, s
        assert tok.id_to_token(i) == s
    text = "<|start|>" if family == "gpt-oss" else "<|im_start|>" if family == "qwen3" else "<｜User｜>"
    enc = tok.encode(f"{text}Hello, wörld 2025!", add_special_tokens=False)
    assert enc.ids[0] == REAL_IDS[(family, preset)][text]
    assert tok.decode(enc.ids, skip_special_tokens=False) == f"{text}Hello, wörld 2025!"


@pytest.mark.parametrize("family", ["gpt-oss", "deepseek-v3", "qwen3"])
def test_tiny_keeps_specials_in_order(family: str) -> None:
    d = presets.dims(family, "tiny", None)
    tiny = SPEC[family](d)
    tok = build(tiny)
    assert tok.get_vocab_size() <= d["vocab"] <= 2048
    real = REAL_IDS[next(k for k in REAL_IDS if k[0] == family)]
    named = sorted((s for s in real if s in tiny.tail or s in tiny.head), key=real.__getitem__)
    assert len(named) >= 5
    ids = [tok.token_to_id(s) for s in named]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), "same order as the released tokenizer"
    if family == "gpt-oss":  # Harmony specials keep their offsets from <|startoftext|>
        assert all(tok.token_to_id(s) - tiny.base == real[s] - 199998 for s in named)


def test_bytes_round_trip_and_merges_are_used() -> None:
    tok = build(qwen3.tokenizer(presets.dims("qwen3", "tiny", None)))
    text = "The quick brown fox: \x00\t é 漢字 🙂 <|im_end|>"
    enc = tok.encode(text)
    assert tok.decode(enc.ids, skip_special_tokens=False) == text
    assert len(tok.encode("the quick brown fox jumps").ids) < len("the quick brown fox jumps") / 2


def test_base_too_small_is_an_error() -> None:
    spec = qwen3.tokenizer({"tok_base": 200})  # fewer ids than the 256 byte symbols
    with pytest.raises(ValueError, match="smaller than the trained one"):
        build(spec)
