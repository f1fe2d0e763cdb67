"""Reading a checkpoint's tensors into engine layers, picking each weight's format from its tensors.

A linear weight ``<base>.weight`` is read as (names as on disk, see docs/formats.md):

| tensors                                                          | format      |
|------------------------------------------------------------------|-------------|
| ``weight`` F8_E4M3 + ``weight_scale_inv`` F32 tile grid           | fp8-block (HF / DeepSeek fine-grained FP8) |
| ``weight`` F8_E4M3 + ``weight_scale`` F32/BF16 tile grid          | fp8-block (compressed-tensors naming) |
| ``weight`` F8_E4M3 + ``weight_scale`` U8/F8_E8M0 [N, K/32]        | mxfp8 (compressed-tensors mxfp8) |
| ``weight_packed`` U8 [N, K/2] + ``weight_scale`` U8 [N, K/32]     | mxfp4 (compressed-tensors mxfp4-pack-quantized: GPT-OSS's bytes; w4a16, dequantized per layer at each call) |
| ``weight`` BF16/F16/F32                                           | dense       |

GPT-OSS fused experts ``mlp.experts.{gate_up,down}_proj`` are [E, out, in] as ``_blocks`` +
``_scales`` (MXFP4 source), or F8 with ``_scale_inv`` (fp8-block) / ``_scale`` (mxfp8); unscaled
ones are transformers' [E, in, out] and are transposed here.  Per-expert weights
(DeepSeek, Qwen) are stacked into [E, out, in].  Every tensor must be consumed: a checkpoint
tensor no layer reads is an error, as is a missing one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checkpoint import Checkpoint, CheckpointError
from .. import formats
from ..kernels.dispatch import Dispatcher
from .layers.norm import RMSNorm
from .qlinear import ActQuant, Dense, Linear, QWeight, quantized

_REQUIRED = object()


def setting(config: dict, *names: str, default: object = _REQUIRED) -> object:
    """The first of ``names`` present in config.json (families spell some settings differently)."""
    for n in names:
        if n in config and config[n] is not None:
            return config[n]
    if default is _REQUIRED:
        raise CheckpointError(f"config.json: missing {' / '.join(names)}")
    return default


@dataclass(frozen=True)
class QuantScheme:
    """Dynamic activation quantization per weight format (absent: activations stay unquantized)."""

    acts: dict[str, ActQuant]  # format name -> how a weight of it quantizes its input

    def act(self, fmt: str) -> ActQuant | None:
        return self.acts.get(fmt)

    @classmethod
    def from_config(cls, config: dict, manifest: dict, act_quant: bool, scale_mn: bool = False) -> QuantScheme:
        """Each format with activation quantization as it serves them (:meth:`quantkit.formats.Format.act_scale_fmt`,
        ``act_rule``): fp8-block activations use UE8M0 scales when the checkpoint's scales are UE8M0 (DeepSeek-V3.1
        ``scale_fmt: ue8m0``; DeepSeek act_quant's 2**ceil(log2 s) is rule rceil); MXFP8 activations use rule rceil,
        as cuBLAS and TransformerEngine quantize them, whatever rule made the weights.  ``scale_mn``: scales written
        MN-major where the format has that layout (fp8-block; the loader sets it on GPUs: DeepGEMM reads them with no
        transposing launch, the Triton kernels read either layout)."""
        if not act_quant:
            return cls({})
        qc = config.get("quantization_config") or {}
        opts = manifest.get("options") or {}
        scale_fmt = qc.get("scale_fmt") or opts.get("scale_fmt") or "float"
        acts = {name: ActQuant(name, f.act_scale_fmt(scale_fmt), f.act_rule, scale_mn and f.scale_mn)
                for name in formats.act_formats() for f in (formats.get(name),)}  # fmt: skip
        return cls(acts)


class Weights:
    def __init__(self, ckpt: Checkpoint, device: torch.device | str, dtype: torch.dtype, scheme: QuantScheme, ops: Dispatcher | None = None) -> None:
        self.ckpt, self.device, self.dtype, self.scheme = ckpt, torch.device(device), dtype, scheme
        self.used: set[str] = set()
        self.ops = ops if ops is not None else Dispatcher()  # shared by every layer of the model: records which backend ran each op

    def expert_ids(self, prefix: str, n: int) -> list[int]:
        """Global ids of the routed experts of the MoE at ``prefix`` (``model.layers.<i>.mlp.``) held here:
        all n, or on a rank directory of ``quantkit shard`` its share (config.json ``quantkit_shard.experts``)."""
        shard = self.ckpt.config.get("quantkit_shard")
        if shard is None:
            return list(range(n))
        layer = prefix.split(".")[2]
        if layer not in shard["experts"]:
            raise CheckpointError(f"{self.ckpt.dir}: config.json quantkit_shard.experts has no layer {layer}")
        return list(shard["experts"][layer])

    def has(self, name: str) -> bool:
        return name in self.ckpt

    def has_linear(self, base: str) -> bool:
        """Whether the checkpoint holds the linear weight ``<base>.weight`` (or its MXFP4 ``weight_packed``)."""
        return self.has(base + ".weight") or self.has(base + ".weight_packed")

    def raw(self, name: str) -> torch.Tensor:
        """A tensor as stored, on the target device."""
        self.used.add(name)
        return self.ckpt.get(name).to(self.device)

    def get(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A source-precision tensor (embedding, norm, bias, sinks) in ``dtype`` (default: compute dtype)."""
        return self.raw(name).to(dtype or self.dtype)

    def opt(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        return self.get(name, dtype) if self.has(name) else None

    def norm(self, name: str, eps: float, order: str = "hf") -> RMSNorm:
        return RMSNorm(self.get(name, torch.float32 if order == "f32" else None), eps, order)

    def _quantized(self, fmt: str, *tensors: torch.Tensor) -> QWeight:
        return quantized(formats.get(fmt), tensors, self.scheme.act(fmt), self.ops)

    def _scaled(self, q_name: str, scale_names: tuple[str, str]) -> QWeight:
        q = self.raw(q_name)
        inv, sc = scale_names
        if self.has(inv):
            return self._quantized("fp8-block", q, self.raw(inv))
        if self.has(sc):
            s = self.raw(sc)
            if s.dtype in (torch.uint8, torch.float8_e8m0fnu):  # E8M0 bytes: one scale per 1x32
                return self._quantized("mxfp8", q, s)
            return self._quantized("fp8-block", q, s)  # float tile scales
        raise CheckpointError(f"{self.ckpt.dir}: {q_name} is F8_E4M3 but has no {inv} or {sc}")

    def weight(self, base: str) -> QWeight:
        """``<base>.weight`` (+ its scales) as a packed weight [N, K]."""
        name = base + ".weight"
        if self.has(base + ".weight_packed"):  # [N, K/2] packed bytes are GPT-OSS's [N, K/32, 16] blocks
            packed = self.raw(base + ".weight_packed")
            return self._quantized("mxfp4", packed.view(*packed.shape[:-1], -1, 16), self.raw(base + ".weight_scale"))
        if self.ckpt.info(name).dtype == "F8_E4M3":
            return self._scaled(name, (base + ".weight_scale_inv", base + ".weight_scale"))
        return Dense(self.raw(name), self.ops)

    def linear(self, base: str, bias: bool = False) -> Linear:
        return Linear(self.weight(base), self.raw(base + ".bias") if bias else None)

    def stacked(self, bases: list[str]) -> QWeight:
        """Per-expert weights ``<base>.weight`` stacked into one [E, N, K] weight of their common format."""
        ws = [self.weight(b) for b in bases]
        kinds = {w.fmt for w in ws}
        if len(kinds) != 1:
            raise CheckpointError(f"{self.ckpt.dir}: experts {bases[0]}.. mix weight formats {sorted(kinds)}")
        first = ws[0]
        bufs = {n: torch.stack([dict(w.named_buffers())[n] for w in ws]) for n, _ in first.named_buffers()}
        if isinstance(first, Dense):
            return Dense(bufs["w"], self.ops)
        return quantized(first.format, [bufs[n] for n in first.format.buffers], first.act, self.ops)

    def fused(self, base: str) -> QWeight:
        """A GPT-OSS fused expert weight (``...experts.gate_up_proj`` / ``down_proj``) as [E, out, in]."""
        if self.has(base + "_blocks"):
            return self._quantized("mxfp4", self.raw(base + "_blocks"), self.raw(base + "_scales"))
        if self.ckpt.info(base).dtype == "F8_E4M3":
            return self._scaled(base, (base + "_scale_inv", base + "_scale"))
        return Dense(self.raw(base).transpose(-1, -2).contiguous(), self.ops)  # transformers keeps [E, in, out]

    def lm_head(self, config: dict) -> Linear:
        """``lm_head.weight``, or the embedding when config.json ties them (small Qwen3 models)."""
        if self.has("lm_head.weight"):
            return self.linear("lm_head")
        if setting(config, "tie_word_embeddings", default=False):
            return Linear(Dense(self.raw("model.embed_tokens.weight"), self.ops))
        raise CheckpointError(f"{self.ckpt.dir}: no lm_head.weight and tie_word_embeddings is not set")

    def check_all_used(self) -> None:
        unused = sorted(set(self.ckpt.names()) - self.used)
        if unused:
            more = f" (+{len(unused) - 5} more)" if len(unused) > 5 else ""
            raise CheckpointError(f"{self.ckpt.dir}: tensors not used by the engine's model: {', '.join(unused[:5])}{more}")
