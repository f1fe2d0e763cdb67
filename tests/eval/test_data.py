"""Evaluation windows: bundled text, the checkpoint's tokenizer, BOS as llama.cpp places it, random fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from quantkit.eval.data import bundled_text, make_windows


def write_tokenizer(d: Path, bos: bool) -> Tokenizer:
    """A word-level tokenizer over the bundled text's words (+ <unk>, <s>), saved as tokenizer.json."""
    words = sorted(set(bundled_text().split()))
    vocab = {"<unk>": 0, "<s>": 1} | {w: i + 2 for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    return tok


def test_bundled_text_is_packaged_prose():
    text = bundled_text()
    assert len(text) > 20_000
    assert "Four score and seven years ago" in text


def test_windows_from_text_with_bos(tmp_path):
    tok = write_tokenizer(tmp_path, bos=True)
    win = make_windows(tmp_path, None, n_tokens=100, ctx=32, vocab_size=tok.get_vocab_size())
    ids = tok.encode(bundled_text(), add_special_tokens=False).ids
    assert win.tokens.shape == (3, 32)  # 100 // 32 windows
    expect = torch.tensor(ids[:96]).view(3, 32)
    assert torch.equal(win.tokens[:, 1:], expect[:, 1:])
    assert win.tokens[:, 0].tolist() == [1, 1, 1]  # BOS replaces each window's first token
    rows, targets = win.scored(1)
    assert (rows.start, rows.stop) == (16, 31)  # logits at ctx/2 .. ctx-2
    assert torch.equal(targets, expect[1, 17:])  # predict tokens ctx/2+1 .. ctx-1
    assert win.n_scored == 3 * 15
    assert "BOS 1" in win.source


def test_windows_without_bos_keep_the_text(tmp_path):
    tok = write_tokenizer(tmp_path, bos=False)
    win = make_windows(tmp_path, None, n_tokens=64, ctx=64, vocab_size=tok.get_vocab_size())
    assert win.tokens[0].tolist() == tok.encode(bundled_text(), add_special_tokens=False).ids[:64]


def test_bos_from_tokenizer_config(tmp_path):
    tok = write_tokenizer(tmp_path, bos=False)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True, "bos_token": {"content": "<s>"}}))
    win = make_windows(tmp_path, None, n_tokens=64, ctx=32, vocab_size=tok.get_vocab_size())
    assert win.tokens[:, 0].tolist() == [1, 1]


def test_data_file(tmp_path):
    tok = write_tokenizer(tmp_path / "ckpt", bos=False)
    f = tmp_path / "text.txt"
    f.write_text("the People " * 40)
    win = make_windows(tmp_path / "ckpt", str(f), n_tokens=40, ctx=20, vocab_size=tok.get_vocab_size())
    assert win.tokens.shape == (2, 20)
    assert win.tokens[0, :2].tolist() == [tok.token_to_id("the"), tok.token_to_id("People")]


def test_random_tokens_when_no_tokenizer(tmp_path):
    a = make_windows(tmp_path, None, n_tokens=50, ctx=16, vocab_size=300, seed=3)
    b = make_windows(tmp_path, "random", n_tokens=50, ctx=16, vocab_size=300, seed=3)
    c = make_windows(tmp_path, "random", n_tokens=50, ctx=16, vocab_size=300, seed=4)
    assert a.tokens.shape == (3, 16) and torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    assert int(a.tokens.min()) >= 0 and int(a.tokens.max()) < 300
    assert "no tokenizer.json" in a.source and "seed 3" in a.source


def test_errors(tmp_path):
    tok = write_tokenizer(tmp_path / "ckpt", bos=False)
    n = tok.get_vocab_size()
    with pytest.raises(ValueError, match="fewer than --tokens"):
        make_windows(tmp_path / "ckpt", None, n_tokens=10**6, ctx=512, vocab_size=n)
    with pytest.raises(ValueError, match="less than one window"):
        make_windows(tmp_path / "ckpt", None, n_tokens=8, ctx=16, vocab_size=n)
    with pytest.raises(ValueError, match="vocab_size"):
        make_windows(tmp_path / "ckpt", None, n_tokens=64, ctx=32, vocab_size=10)
    with pytest.raises(ValueError, match="no tokenizer.json"):
        make_windows(tmp_path, str(tmp_path / "ckpt" / "tokenizer.json"), n_tokens=64, ctx=32, vocab_size=n)
