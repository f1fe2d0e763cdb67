"""Evaluation token windows: text tokenized with the checkpoint's own tokenizer, or random tokens.

Layout, as llama.cpp's ``--kl-divergence`` (tools/perplexity/perplexity.cpp): the token stream is
cut into ``n = tokens // ctx`` windows of ``ctx`` tokens; when the tokenizer adds a BOS token,
the first token of each window is replaced by it; each window runs as its own sequence from
position 0, and only its second half is scored: logits at positions ``ctx//2 .. ctx-2`` predict
tokens ``ctx//2 + 1 .. ctx-1`` (``ctx - 1 - ctx//2`` tokens per window), so every scored token
has at least ``ctx//2`` tokens of context.

Text: the bundled ``data/public_domain.txt`` (US founding documents, Lincoln's addresses, plain
essays) or ``--data FILE``.  Tokenizer: ``tokenizer.json`` in the checkpoint directory, read by
the ``tokenizers`` library.  Without one, windows are uniform random token ids from a seeded
generator over the config's ``vocab_size``, and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from ..tokenizer import bos_id

BUNDLED = "public_domain.txt"
RANDOM = "random"


@dataclass(frozen=True)
class Windows:
    tokens: torch.Tensor  # [n_windows, ctx] int64
    source: str  # what the tokens are, for the report

    @property
    def ctx(self) -> int:
        return self.tokens.shape[1]

    @property
    def first(self) -> int:
        """First scored logit position of each window (llama.cpp: ``n_ctx/2``)."""
        return self.ctx // 2

    @property
    def n_scored(self) -> int:
        return self.tokens.shape[0] * (self.ctx - 1 - self.first)

    def scored(self, w: int) -> tuple[slice, torch.Tensor]:
        """Logit rows scored in window ``w`` and the next tokens they predict."""
        return slice(self.first, self.ctx - 1), self.tokens[w, self.first + 1:]


def bundled_text() -> str:
    return resources.files("quantkit.eval").joinpath("data", BUNDLED).read_text(encoding="utf-8")



def make_windows(ckpt: str | Path, data: str | None, n_tokens: int, ctx: int, vocab_size: int, seed: int = 0) -> Windows:
    """``n_tokens // ctx`` windows of ``ctx`` tokens from ``data`` (a file, ``"random"``, or None
    for the bundled text) tokenized with ``ckpt``'s tokenizer."""
    if ctx < 4:
        raise ValueError(f"--ctx {ctx}: a window needs at least 4 tokens (half of it is context)")
    n = n_tokens // ctx
    if n < 1:
        raise ValueError(f"--tokens {n_tokens} is less than one window of --ctx {ctx}")
    ckpt = Path(ckpt)
    tok_path = ckpt / "tokenizer.json"
    if data == RANDOM or (data is None and not tok_path.exists()):
        why = "asked for" if data == RANDOM else f"no tokenizer.json in {ckpt}"
        g = torch.Generator().manual_seed(seed)
        toks = torch.randint(0, vocab_size, (n, ctx), generator=g, dtype=torch.int64)
        return Windows(toks, f"random tokens, seed {seed} ({why})")
    if not tok_path.exists():
        raise ValueError(f"--data {data}: {ckpt} has no tokenizer.json to tokenize it with (use --data random)")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_path))
    text = bundled_text() if data is None else Path(data).read_text(encoding="utf-8")
    ids = tok.encode(text, add_special_tokens=False).ids
    name = f"bundled {BUNDLED}" if data is None else str(data)
    if len(ids) < n * ctx:
        raise ValueError(f"{name} gives {len(ids)} tokens, fewer than --tokens {n * ctx}: ask for fewer tokens or give a longer --data")
    if max(ids) >= vocab_size:
        raise ValueError(f"tokenizer.json gives id {max(ids)} but the model's vocab_size is {vocab_size}")
    toks = torch.tensor(ids[: n * ctx], dtype=torch.int64).view(n, ctx)
    bos = bos_id(ckpt, tok)
    if bos is not None:
        toks[:, 0] = bos  # llama.cpp: BOS replaces the first token of each window
    return Windows(toks, f"{name}, {n} windows of {ctx} tokens" + (f", BOS {bos}" if bos is not None else ""))
