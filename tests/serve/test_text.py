"""Tokenizer, chat template, incremental detokenization, stop strings and Harmony channels.

transformers' tokenizer is the judge of prompt encoding and chat rendering on each family's
``quantkit synth`` tokenizer (the upstream templates' structure: Qwen's ChatML, DeepSeek's
BOS + role markers, GPT-OSS's Harmony)."""

from __future__ import annotations

import json

import pytest
import torch

from quantkit.serve.sampling import SamplingParams, _truncate, adjust, sample
from quantkit.serve.text import Detokenizer, ModelText, split_harmony

FAMILIES = ["gpt-oss", "deepseek-v3", "qwen3", "qwen3-moe"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there, 中文?"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again"}]


def text_of(path) -> ModelText:
    return ModelText(path, json.loads((path / "config.json").read_text()))


@pytest.mark.parametrize("family", FAMILIES)
def test_prompts_and_chats_encode_as_transformers_does(ckpt, family):
    from transformers import AutoTokenizer

    path = ckpt(family)
    ours, hf = text_of(path), AutoTokenizer.from_pretrained(str(path))
    for s in ("Hello world", " leading space and 中文 ✓", "a"):
        assert ours.encode(s) == hf(s).input_ids
    want = hf.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    want = want["input_ids"] if not isinstance(want, list) else want
    assert ours.encode_chat(MESSAGES) == list(want)
    assert hf.eos_token_id in ours.eos_ids


def test_end_of_sequence_ids_gather_every_source(ckpt):
    t = text_of(ckpt("gpt-oss"))
    gen = json.loads((ckpt("gpt-oss") / "generation_config.json").read_text())["eos_token_id"]
    assert set(gen) <= set(t.eos_ids)  # <|return|>, <|endoftext|>, <|call|>
    assert t.token_str(t.eos_ids[0]) == "<|return|>"


def test_no_template_or_bad_messages_is_a_clear_error(ckpt, tmp_path):
    t = text_of(ckpt("qwen3"))
    t.chat_template = "{{ raise_exception('only user turns') }}"
    with pytest.raises(ValueError, match="refused the messages: only user turns"):
        t.encode_chat(MESSAGES)
    t.chat_template = None
    with pytest.raises(ValueError, match="has no chat template"):
        t.encode_chat(MESSAGES)


def test_detokenizer_waits_for_whole_characters(ckpt):
    t = text_of(ckpt("qwen3"))
    ids = t.encode("中文 ok ✓ 😀ψ")
    assert any("\ufffd" in t.tok.decode([i]) for i in ids)  # byte-level: some characters span several tokens
    d = Detokenizer(t.tok)
    pieces = []
    for i in ids:
        d.add(i)
        pieces.append(d.delta())
    assert "".join(pieces) == "中文 ok ✓ 😀ψ" == d.text
    assert all("\ufffd" not in p for p in pieces)


def test_stop_strings_cut_the_text_and_hold_back_what_they_may_claim(ckpt):
    t = text_of(ckpt("qwen3"))
    ids = t.encode("one two three four")
    d = Detokenizer(t.tok, stop=("three", "xyz"))
    hit, sent = None, ""
    for i in ids:
        hit = d.add(i)
        sent += d.delta()
        if hit:
            break
    assert hit == "three" and d.text == "one two "
    assert len(sent) <= len("one two ") and not sent.endswith("thr")
    d.finish()
    assert sent + d.delta() == "one two "
    keep = Detokenizer(t.tok, stop=("two",), include_stop_str=True)
    for i in ids:
        if keep.add(i):
            break
    assert keep.text == "one two"


def test_harmony_channels():
    text = ("<|channel|>analysis<|message|>User says hi.<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|return|>")
    assert split_harmony(text) == ("User says hi.", "Hello!")
    assert split_harmony("<|channel|>analysis<|message|>thinking so fa") == ("thinking so fa", "")
    assert split_harmony("<|channel|>fin") == ("", "")  # a header still arriving
    assert split_harmony("plain words<|return|>") == ("", "plain words")
    tool = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>"
    assert split_harmony(tool) == ("", "{}")


def test_truncation_keeps_the_top_k_and_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    assert torch.isfinite(_truncate(logits, 2, 1.0)).tolist() == [True, True, False, False, False]
    # top_p 0.7: 0.5 + 0.2 reaches it, so the third token is cut; 0.71 needs the third
    assert torch.isfinite(_truncate(logits, -1, 0.7)).tolist() == [True, True, False, False, False]
    assert torch.isfinite(_truncate(logits, -1, 0.71)).tolist() == [True, True, True, False, False]
    assert torch.isfinite(_truncate(logits, -1, 0.01)).tolist() == [True, False, False, False, False]


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    g = torch.Generator().manual_seed(0)
    draws = torch.tensor([sample(logits, SamplingParams(temperature=1.0), g) for _ in range(4000)])
    freq = torch.bincount(draws, minlength=3).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.6, 0.3, 0.1]), atol=0.03)
    cold = torch.tensor([sample(logits, SamplingParams(temperature=0.25), g) for _ in range(2000)])
    # temperature 1/4: p ~ p^4, normalised: 0.6^4 / (0.6^4 + 0.3^4 + 0.1^4) = 0.9403
    assert abs((cold == 0).float().mean().item() - 0.9403) < 0.02


def test_bad_sampling_params_are_refused():
    for kw, msg in [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": 0}, "top_k"),
                    ({"logprobs": 21}, "logprobs"), ({"max_tokens": -1}, "max_tokens"), ({"stop": ("",)}, "stop")]:
        with pytest.raises(ValueError, match=msg):
            SamplingParams(**kw)


def test_a_cut_character_at_the_end_decodes_as_a_whole_decode_does(ckpt):
    t = text_of(ckpt("qwen3"))
    ids = t.encode("ab 😀")
    cut = next(k for k in range(1, len(ids)) if t.tok.decode(ids[:k]).endswith("\ufffd"))
    d = Detokenizer(t.tok)
    for i in ids[:cut]:
        d.add(i)
    assert not d.text.endswith("\ufffd")  # held back while more bytes may come
    d.finish()
    assert d.text == t.tok.decode(ids[:cut]) and d.text.endswith("\ufffd")


def test_bias_and_penalties_by_hand():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0])
    p = SamplingParams(logit_bias=((1, 5.0),), repetition_penalty=2.0, frequency_penalty=0.1, presence_penalty=0.5)
    # bias: id 1 -> 4.0 (never seen: no repetition penalty); seen {0, 2, 3}: 2 -> 1, 0.5 -> 0.25, 3 -> 1.5;
    # generated twice / once: id 2 -0.2 -0.5, id 3 -0.1 -0.5
    got = adjust(logits, p, prompt=[0], output=[2, 2, 3])
    assert torch.allclose(got, torch.tensor([1.0, 4.0, -0.45, 0.9]))
    neg = adjust(torch.tensor([-2.0, 1.0]), SamplingParams(repetition_penalty=1.5), prompt=[0], output=[])
    assert torch.allclose(neg, torch.tensor([-3.0, 1.0]))  # a negative logit is multiplied
    assert torch.equal(logits, torch.tensor([2.0, -1.0, 0.5, 3.0]))  # the model's logits are left as they were
    assert sample(logits, SamplingParams(temperature=0, logit_bias=((1, 5.0),)), torch.Generator()) == 1


def test_stop_strings_wait_for_min_tokens(ckpt):
    t = text_of(ckpt("qwen3"))
    ids = t.encode("one two three")
    d = Detokenizer(t.tok, stop=("two",))
    assert all(d.add(i, check_stop=False) is None for i in ids) and d.text == "one two three"


def two_decode_texts(tok, ids: list[int], skip: bool) -> list[str]:
    """The incremental rule written out (vLLM's prefix and read offsets, two decodes a token): the text after each token."""
    prefix = read = 0
    text, out = "", []
    for k in range(1, len(ids) + 1):
        before = tok.decode(ids[prefix:read], skip_special_tokens=skip)
        now = tok.decode(ids[prefix:k], skip_special_tokens=skip)
        if len(now) > len(before) and not now.endswith("\ufffd"):
            text, prefix, read = text + now[len(before):], read, k
        out.append(text)
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("skip", [True, False])
def test_detokenizers_sharing_decoded_pieces_follow_the_two_decode_rule(ckpt, family, skip):
    """ModelText's detokenizers share single tokens decoded once (the text before a new token is most often its
    previous token's): interleaved, over the whole vocabulary (byte tokens that split characters, special
    tokens), each one's text after every token is the rule's."""
    t = text_of(ckpt(family))
    g = torch.Generator().manual_seed(1)
    vocab = t.tok.get_vocab_size()
    seqs = [torch.randint(0, vocab, (40,), generator=g).tolist() for _ in range(3)] + [t.encode("中文 ok ✓ 😀ψ") * 2]
    dets = [t.detokenizer(skip_special_tokens=skip) for _ in seqs]
    want = [two_decode_texts(t.tok, ids, skip) for ids in seqs]
    for k in range(max(map(len, seqs))):
        for d, ids, texts in zip(dets, seqs, want):
            if k < len(ids):
                d.add(ids[k])
                assert d.text == texts[k], (family, skip, k)
    assert len(t.pieces[skip]) > 40  # the pieces were shared
