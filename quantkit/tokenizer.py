"""What a checkpoint's tokenizer adds on its own, read once for every command that encodes text
(``eval``'s windows, ``serve``'s prompts)."""

from __future__ import annotations

import json
from pathlib import Path

def bos_id(ckpt: Path, tok) -> int | None:
    """The BOS id the tokenizer prepends: through tokenizer.json's post-processor, or
    tokenizer_config.json's ``add_bos_token`` (how Llama-style tokenizers such as DeepSeek's say it)."""
    plain = tok.encode("a", add_special_tokens=False).ids
    full = tok.encode("a", add_special_tokens=True).ids
    if len(full) > len(plain) and full[-len(plain):] == plain:
        return full[0]
    cfg_path = ckpt / "tokenizer_config.json"
    if cfg_path.exists():
        cfg = json.loads(cfg_path.read_text())
        bos = cfg.get("bos_token")
        bos = bos.get("content") if isinstance(bos, dict) else bos
        if cfg.get("add_bos_token") and bos is not None:
            i = tok.token_to_id(bos)
            if i is None:
                raise ValueError(f"{cfg_path}: bos_token {bos!r} is not in tokenizer.json's vocabulary")
            return i
    return None
