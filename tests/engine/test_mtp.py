"""DeepSeek's multi-token-prediction layer ``model.layers.{num_hidden_layers}``: loaded from
DeepSeek's on-disk names and computed as transformers' ``MtpLayer`` computes it (the reference
built here from transformers' ``MtpModel``, its random weights written under DeepSeek's names)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from quantkit.engine import Batch, load

from .test_faithfulness import assert_logits_close
from .tiny import _randomize, hf_model, token_ids


def _deepseek_names(mtp_state: dict[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    """transformers MtpModel state -> DeepSeek checkpoint tensors of layer n (experts per expert)."""
    p = f"model.layers.{n}."
    out: dict[str, torch.Tensor] = {}
    for k, v in mtp_state.items():
        if k == "embed_tokens.weight":
            out[p + "embed_tokens.weight"] = v
        elif k == "shared_head.weight":
            out[p + "shared_head.head.weight"] = v
        elif k == "layers.0.post_norm.weight":
            out[p + "shared_head.norm.weight"] = v
        elif k.endswith("experts.gate_up_proj"):
            for e, (g, u) in enumerate(zip(*v.chunk(2, dim=1), strict=True)):  # concatenated [gate | up]
                out[p + f"mlp.experts.{e}.gate_proj.weight"], out[p + f"mlp.experts.{e}.up_proj.weight"] = g, u
        elif k.endswith("experts.down_proj"):
            for e, d in enumerate(v):
                out[p + f"mlp.experts.{e}.down_proj.weight"] = d
        else:
            out[p + k.removeprefix("layers.0.").removeprefix("mtp_block.")] = v
    return {k: v.bfloat16().contiguous() for k, v in out.items()}


def test_mtp_layer_matches_transformers(tiny, tmp_path: Path) -> None:
    from transformers.modeling_layers import MtpModel

    src = tiny("deepseek-v3")
    main = hf_model(src)
    mtp = MtpModel(main, 1).eval()
    _randomize(mtp.layers, seed=5)
    for t in mtp.layers.parameters():
        t.data = t.data.bfloat16().float()  # what the checkpoint will hold
    n = main.config.num_hidden_layers
    dst = shutil.copytree(src, tmp_path / "with-mtp")
    tensors = load_file(dst / "model.safetensors") | _deepseek_names(mtp.state_dict(), n)
    save_file(tensors, dst / "model.safetensors")

    model = load(dst, dtype=torch.float32)
    assert model.mtp is not None and len(model.cache_specs()) == n + 1
    ids = token_ids(10, seed=9)
    pos = torch.arange(1, 10)
    with torch.no_grad():
        h_ref = main.model(ids[None]).last_hidden_state
        ref = mtp._project_to_logits(mtp.forward_layer(0, h_ref[:, :-1], pos[None], None, input_ids=ids[None, 1:]))[0]
        h = model.hidden(ids)
        ours = model.mtp(ids[1:], h[:-1], Batch((0, 9), pos))
    assert (h - h_ref[0]).abs().max() < 1e-5
    assert_logits_close(ours, ref.float(), "MTP")

    # the MTP layer's own KV cache (layer n): a prefill chunk then decode steps equal one prefill
    cache = model.new_cache(num_blocks=4, block_size=4)
    parts = []
    with torch.no_grad():
        whole = model.mtp(ids[1:], h[:-1], Batch.prefill([9]))
        for lo, hi in ((0, 6), (6, 7), (7, 9)):
            step = cache.schedule({"s": hi - lo})
            parts.append(model.mtp(ids[1 + lo : 1 + hi], h[lo:hi], step, cache))
    assert (torch.cat(parts) - whole).abs().max() < 2e-5
