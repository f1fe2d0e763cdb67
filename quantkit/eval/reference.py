"""Reference runners: implementations no one here wrote, run in float32 on the source checkpoint.

Every runner maps one window of token ids [T] to a :class:`Forward`: float32 logits [T, V] and
the residual stream at L+1 points, the one layer indexing all runners share:

    hidden[0]   the embeddings (input of decoder layer 0)
    hidden[i]   the output of decoder layer i-1 (residual stream, before the final norm), i = 1..L

transformers' ``output_hidden_states`` gives L+1 states of which entries 0..L-1 are exactly
hidden[0..L-1]; its entry L is the *final-normed* state (``capture_outputs`` ties the last hidden
state to ``last_hidden_state``), so hidden[L] is taken from a forward hook on the last decoder
layer instead.  The gpt-oss torch reference (``gpt_oss.torch.model.Transformer``, the
``original/`` layout) exposes no hidden states: hooks on ``embedding`` and each ``block[i]``
give the same L+1 points.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from ..checkpoint import load_json_object

IMPLS = ("transformers", "gpt-oss", "engine")


@dataclass
class Forward:
    logits: torch.Tensor  # [T, V] float32
    hidden: list[torch.Tensor]  # L+1 x [T, H] float32 (see module docstring)


class Runner(Protocol):
    label: str  # what ran, for the report

    def forward(self, tokens: torch.Tensor) -> Forward: ...


def read_config(path: str | Path) -> dict:
    p = Path(path) / "config.json"
    if not p.exists():
        raise ValueError(f"{path}: no config.json")
    return load_json_object(p.read_bytes(), str(p), "the file")


def _dequantize_config(cfg: dict, path: Path):
    """transformers quantization config that dequantizes the source on load (into the model's F32)."""
    qc = cfg.get("quantization_config")
    if not qc:
        return None
    method = qc.get("quant_method")
    if method == "mxfp4":
        from transformers import Mxfp4Config

        return Mxfp4Config(dequantize=True)
    if method == "fp8":
        from transformers import FineGrainedFP8Config

        return FineGrainedFP8Config(dequantize=True, weight_block_size=tuple(qc.get("weight_block_size", (128, 128))))
    raise ValueError(f"{path}: transformers reference cannot dequantize quant_method {method!r}; use --impl engine")


def _check_loading(info: dict, n_layers: int, path: Path) -> None:
    """Fail on missing or mis-shaped weights (transformers would random-init them); tolerate only
    unexpected keys of layers past num_hidden_layers (DeepSeek's MTP layer, which it does not run)."""
    extra = [k for k in info["unexpected_keys"] if not _beyond(k, n_layers)]
    problems = {"missing": sorted(info["missing_keys"]), "mismatched": sorted(map(str, info["mismatched_keys"])),
                "unexpected": sorted(extra), "errors": [str(e) for e in info.get("error_msgs", ())]}
    bad = {k: v for k, v in problems.items() if v}
    if bad:
        detail = "; ".join(f"{k}: {', '.join(v[:5])}{' ...' if len(v) > 5 else ''}" for k, v in bad.items())
        raise ValueError(f"{path}: transformers did not load the checkpoint cleanly ({detail})")


def _beyond(key: str, n_layers: int) -> bool:
    m = re.match(r"model\.layers\.(\d+)\.", key)
    return m is not None and int(m.group(1)) >= n_layers


class TransformersRunner:
    """transformers' model for the checkpoint's architecture, float32 weights, eager attention."""

    def __init__(self, path: str | Path, device: str = "cpu") -> None:
        import transformers
        from transformers import AutoModelForCausalLM

        self.path = Path(path)
        cfg = read_config(self.path)
        kwargs = {}
        qc = _dequantize_config(cfg, self.path)
        if qc is not None:
            kwargs["quantization_config"] = qc
        try:
            model, info = AutoModelForCausalLM.from_pretrained(
                self.path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True, **kwargs
            )
        except (RuntimeError, ValueError) as e:  # e.g. its FP8 dequantizer rejects partial 128-tiles
            msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise ValueError(f"{self.path}: transformers cannot load this checkpoint ({msg}); try --impl engine") from None
        n_layers = model.config.num_hidden_layers
        _check_loading(info, n_layers, self.path)
        bad = sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float32})
        if bad:
            raise ValueError(f"{self.path}: transformers left parameters in {bad}, not float32")
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        self.layers = self.model.model.layers[:n_layers]
        how = " (dequantized on load)" if qc is not None else ""
        self.label = f"transformers {transformers.__version__} {type(model).__name__}, float32{how}, eager attention, {device}"

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor) -> Forward:
        last: list[torch.Tensor] = []
        hook = self.layers[-1].register_forward_hook(lambda _m, _a, out: last.append(out[0] if isinstance(out, tuple) else out))
        try:
            out = self.model(input_ids=tokens.to(self.device)[None], output_hidden_states=True, use_cache=False)
        finally:
            hook.remove()
        hs = out.hidden_states
        if len(hs) != len(self.layers) + 1 or len(last) != 1:
            raise RuntimeError(f"transformers returned {len(hs)} hidden states for {len(self.layers)} layers")
        hidden = [h[0].float() for h in hs[:-1]] + [last[0][0].float()]
        return Forward(out.logits[0].float(), hidden)


class GptOssRunner:
    """openai/gpt-oss's torch reference (``original/`` layout), cast to float32 after loading
    (its MXFP4 and BF16 weights are exact in BF16, so the cast loses nothing)."""

    def __init__(self, path: str | Path, device: str = "cpu") -> None:
        try:
            from gpt_oss.torch.model import Transformer
        except ImportError as e:
            raise ValueError(f"--impl gpt-oss needs the gpt-oss package (pip install gpt-oss): {e}") from None
        orig = Path(path) / "original"
        if not (orig / "config.json").exists():
            raise ValueError(f"{path}: --impl gpt-oss reads the original/ layout, and {orig}/config.json is missing")
        self.model = Transformer.from_checkpoint(str(orig), device=device).float().eval()
        self.device = torch.device(device)
        self.label = f"gpt-oss torch reference ({orig}), float32, {device}"

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor) -> Forward:
        states: list[torch.Tensor] = []
        mods = [self.model.embedding, *self.model.block]
        hooks = [m.register_forward_hook(lambda _m, _a, out: states.append(out.float())) for m in mods]
        try:
            logits = self.model(tokens.to(self.device))
        finally:
            for h in hooks:
                h.remove()
        return Forward(logits.float(), states)


def open_reference(impl: str, path: str | Path, device: str = "cpu") -> Runner:
    """The transformers or gpt-oss runner (``--impl engine`` runs the candidate runner on the source)."""
    if impl == "transformers":
        return TransformersRunner(path, device)
    if impl == "gpt-oss":
        return GptOssRunner(path, device)
    raise ValueError(f"--impl {impl!r}: choose one of {', '.join(IMPLS)}")
