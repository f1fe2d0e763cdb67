"""Working tokenizers for synthetic checkpoints, built offline with the ``tokenizers`` library.

A byte-level BPE is trained on a small built-in text (:mod:`.corpus`) (so any string round-trips), padded with
unreachable filler tokens up to ``base`` ids (the real vocabulary sizes of full-size presets),
and followed by the family's special tokens at consecutive ids, as in the released tokenizers:
GPT-OSS's Harmony specials from 199998, Qwen's from 151643, DeepSeek's placeholders and chat
specials from 128000 (its bos/eos/pad sit at ids 0-2).  Tiny presets keep the same strings in
the same order at the top of a small vocabulary.  The pre-tokenizer splits with each family's
regexes before the byte-level step, like the upstream tokenizer.json files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from .corpus import CORPUS

FILLER = "\u0120tok{}"  # "Ġtok123": decodes to " tok123"; never produced by the merges


@dataclass(frozen=True)
class TokenizerSpec:
    base: int  # ids [0, base) are BPE tokens (``head`` specials included)
    tail: tuple[str, ...]  # special tokens at ids base, base + 1, ...
    head: tuple[str, ...] = ()  # special tokens at ids 0, 1, ... (DeepSeek)
    splits: tuple[str, ...] = ()  # pre-tokenizer regexes (isolated splits, in order), then byte-level
    nfc: bool = False
    bos_prefix: str | None = None  # prepended to every encoded sequence (DeepSeek's add_bos_token)
    config: dict = field(default_factory=dict)  # tokenizer_config.json fields (roles, class)
    chat_template: str | None = None
    template_file: bool = False  # chat_template.jinja beside tokenizer_config.json (GPT-OSS) instead of inside

    def token_id(self, token: str) -> int:
        if token in self.head:
            return self.head.index(token)
        if token in self.tail:
            return self.base + self.tail.index(token)
        raise KeyError(f"{token!r} is not a special token of this tokenizer")

    @property
    def size(self) -> int:
        return self.base + len(self.tail)


def _empty(spec: TokenizerSpec) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    if spec.nfc:
        tok.normalizer = normalizers.NFC()
    splits = [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in spec.splits]
    tok.pre_tokenizer = pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not splits)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _trained_model(spec: TokenizerSpec) -> dict:
    """BPE model JSON trained on CORPUS, then padded with filler tokens to exactly ``base`` ids."""
    tok = _empty(spec)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.base, min_frequency=1, show_progress=False,
        special_tokens=list(spec.head), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    if len(vocab) > spec.base:
        raise ValueError(f"tokenizer base vocabulary {spec.base} is smaller than the trained one ({len(vocab)})")
    i = 0
    while len(vocab) < spec.base:
        if (t := FILLER.format(i)) not in vocab:
            vocab[t] = len(vocab)
        i += 1
    return model


def build(spec: TokenizerSpec) -> Tokenizer:
    """The tokenizer: trained byte-level BPE + fillers + specials at their ids."""
    model = _trained_model(spec)
    tok = _empty(spec)
    data = json.loads(tok.to_str())
    data["model"] = model
    tok = Tokenizer.from_str(json.dumps(data))
    specials = [AddedToken(t, special=True, normalized=False) for t in (*spec.head, *spec.tail)]
    tok.add_special_tokens(specials)
    if spec.bos_prefix is not None:
        bos = (spec.bos_prefix, spec.token_id(spec.bos_prefix))
        tok.post_processor = processors.TemplateProcessing(single=f"{bos[0]} $A", pair=f"{bos[0]} $A {bos[0]} $B", special_tokens=[bos])
    for t in (*spec.head, *spec.tail):
        if tok.token_to_id(t) != spec.token_id(t):
            raise AssertionError(f"special token {t!r} landed at id {tok.token_to_id(t)}, not {spec.token_id(t)}")
    return tok


def write(spec: TokenizerSpec, folder: Path) -> list[str]:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json (+ chat_template.jinja); return the names."""
    tok = build(spec)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    cfg = dict(spec.config)
    names = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    if spec.chat_template is not None:
        if spec.template_file:
            (folder / "chat_template.jinja").write_text(spec.chat_template, encoding="utf-8")
            names.append("chat_template.jinja")
        else:
            cfg["chat_template"] = spec.chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    roles = {k: v for k, v in spec.config.items() if k in ("bos_token", "eos_token", "pad_token", "unk_token") and v is not None}
    (folder / "special_tokens_map.json").write_text(json.dumps(roles, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return names
