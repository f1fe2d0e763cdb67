"""Shared pieces of the converter tests: synthetic sources (made once per test package), conversions,
and surgery on checkpoints to make bad inputs."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from quantkit.converters import ConvertOptions, convert
from quantkit.synth import synthesize


class Synth:
    """Synthetic checkpoints by (family, preset, layout, scale_fmt), each written once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: dict[tuple, Path] = {}

    def __call__(self, family: str, preset: str = "tiny", layout: str = "root", scale_fmt: str = "float", **kw) -> Path:
        key = (family, preset, layout, scale_fmt, tuple(sorted(kw.items())))
        if key not in self.made:
            dst = self.root / "-".join(str(k) for k in key[:4]) / f"v{len(self.made)}"
            synthesize(family, dst, preset=preset, layout=layout, scale_fmt=scale_fmt, **kw)
            self.made[key] = dst
        return self.made[key]


def run(src: Path, dst: Path, **opts) -> dict:
    return convert(src, dst, ConvertOptions(**opts))


def tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory (tiny checkpoints only)."""
    out: dict[str, torch.Tensor] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def header(ckpt: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype tag, shape) over every shard, read from the headers."""
    out = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        raw = f.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        h = json.loads(raw[8 : 8 + n])
        h.pop("__metadata__", None)
        out.update({k: (v["dtype"], v["shape"]) for k, v in h.items()})
    return out


def dir_digest(path: Path) -> str:
    """sha256 over every file (relative name + bytes) under ``path``: proves a source untouched."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(path).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def shard_bytes(ckpt: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(ckpt.glob("*.safetensors"))}


def copy_ckpt(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def rewrite(ckpt: Path, edit) -> None:
    """Apply ``edit(dict name -> tensor)`` (in place, may add/remove) to a one-shard checkpoint; fix the index."""
    (shard,) = sorted(ckpt.glob("*.safetensors"))
    t = dict(load_file(shard))
    edit(t)
    save_file(t, shard, metadata={"format": "pt"})
    idx = ckpt / "model.safetensors.index.json"
    if idx.exists():
        d = json.loads(idx.read_text())
        d["weight_map"] = {k: shard.name for k in t}
        idx.write_text(json.dumps(d))


def edit_config(ckpt: Path, edit) -> None:
    p = ckpt / "config.json"
    cfg = json.loads(p.read_text())
    edit(cfg)
    p.write_text(json.dumps(cfg))


def write_qwen3(dst: Path, hidden: int, inter: int, layers: int, vocab: int, shard_bytes: int = 256 << 20) -> int:
    """A plain BF16 Qwen3 checkpoint with larger tensors than the synth presets, written layer by
    layer (one random block per shape, rescaled per layer: fast to make); returns its tensor bytes."""
    heads = hidden // 128
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": hidden, "intermediate_size": inter,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": heads, "head_dim": 128,
           "vocab_size": vocab, "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}
    dst.mkdir(parents=True)
    (dst / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    base = {s: torch.randn(s, generator=g) * 0.02 for s in {(hidden, hidden), (inter, hidden), (hidden, inter)}}
    names = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (hidden, hidden), "self_attn.v_proj": (hidden, hidden),
             "self_attn.o_proj": (hidden, hidden), "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
             "mlp.down_proj": (hidden, inter)}
    shard: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g).bfloat16()}
    wmap: dict[str, str] = {}
    total = 0

    def flush() -> None:
        nonlocal shard, total
        fname = f"model-{len(set(wmap.values())) + 1:05d}.safetensors"
        save_file(shard, dst / fname, metadata={"format": "pt"})
        wmap.update({k: fname for k in shard})
        total += sum(t.numel() * t.element_size() for t in shard.values())
        shard = {}

    for i in range(layers):
        p = f"model.layers.{i}."
        for n, s in names.items():
            shard[f"{p}{n}.weight"] = (base[s] * (1 + 0.01 * i)).bfloat16()
        for n, size in (("input_layernorm", hidden), ("post_attention_layernorm", hidden), ("self_attn.q_norm", 128), ("self_attn.k_norm", 128)):
            shard[f"{p}{n}.weight"] = torch.ones(size, dtype=torch.bfloat16)
        if sum(t.numel() * t.element_size() for t in shard.values()) > shard_bytes:
            flush()
    shard["model.norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    shard["lm_head.weight"] = torch.randn(vocab, hidden, generator=g).bfloat16()
    flush()
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wmap}))
    return total
