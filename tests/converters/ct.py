"""compressed-tensors checkpoints made by the compressed-tensors library itself (the judge of that
format, no code of ours): each Linear weight of a plain BF16 checkpoint gets its scale from the
library's ``calculate_qparams`` over the min/max its strategy groups, and its stored tensors from
the library's compressor for the scheme's format; ``quantization_config`` is the library's
``QuantizationConfig`` with the fields its ``ModelCompressor.update_config`` adds.  As llm-compressor
recipes do, ``lm_head`` and the MoE routers are ignored unless ``ignore`` says otherwise."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ROUTERS = r"re:.*mlp\.gate$"
DEFAULT_IGNORE = ("lm_head", ROUTERS)


def _observe(w: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of ``w`` [N, K] over the groups of the weight strategy (observer-free)."""
    n, k = w.shape
    s = str(getattr(args.strategy, "value", args.strategy))
    if s == "tensor":
        return w.amin().reshape(1), w.amax().reshape(1)
    if s == "channel":
        return w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    if s == "group":
        g = w.unflatten(1, (k // args.group_size, args.group_size))
        return g.amin(-1), g.amax(-1)
    if s == "block":
        from compressed_tensors.quantization.utils import maybe_pad_tensor_for_block_quant

        bn, bk = args.block_structure
        p = maybe_pad_tensor_for_block_quant(w, (bn, bk))
        t = p.unflatten(0, (-1, bn)).unflatten(2, (-1, bk))  # [N/bn, bn, K/bk, bk]
        return t.amin((1, 3)), t.amax((1, 3))
    raise ValueError(f"strategy {s} not handled by this helper")


def compress(w: torch.Tensor, scheme) -> dict[str, torch.Tensor]:
    """One Linear weight [N, K] -> its stored tensors (local names) by the library's compressor."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.compressors.format import infer_module_format
    from compressed_tensors.quantization.utils import calculate_qparams

    lo, hi = _observe(w, scheme.weights)
    scale, _ = calculate_qparams(lo, hi, scheme.weights)  # in w's dtype, as llm-compressor's scale parameters
    fmt = infer_module_format(torch.nn.Linear, scheme)
    out = BaseCompressor.get_value_from_registry(fmt.value).compress({"weight": w, "weight_scale": scale}, scheme)
    return {k: v.contiguous() for k, v in out.items()}


def _is_linear(name: str, t: torch.Tensor) -> bool:
    return name.endswith(".weight") and t.dim() == 2 and "embed_tokens" not in name


def make(src: Path, dst: Path, preset: str, ignore: tuple[str, ...] = DEFAULT_IGNORE, static_input: bool = False,
         dtype: torch.dtype = torch.bfloat16) -> Path:
    """A compressed-tensors copy of the BF16 checkpoint ``src`` with every non-ignored Linear in
    ``preset`` (a compressed-tensors preset scheme name: FP8_BLOCK, FP8, FP8_DYNAMIC, MXFP8, MXFP4).
    ``dtype``: the weights' dtype when compressed, which float scales take (BF16 or F32)."""
    from compressed_tensors import __version__
    from compressed_tensors.compressors.format import infer_module_format
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme, preset_name_to_scheme
    from compressed_tensors.utils.match import match_name

    scheme: QuantizationScheme = preset_name_to_scheme(preset, ["Linear"])
    fmt = infer_module_format(torch.nn.Linear, scheme).value
    scheme.format = fmt
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "quantkit.json", "model.safetensors.index.json"))
    wmap = {}
    for f in sorted(src.glob("*.safetensors")):
        out: dict[str, torch.Tensor] = {}
        for name, t in load_file(f).items():
            module = name.removesuffix(".weight")
            if not _is_linear(name, t) or any(match_name(module, i) for i in ignore):
                out[name] = t
                continue
            out.update({f"{module}.{k}": v for k, v in compress(t.to(dtype), scheme).items()})
            if static_input:  # the FP8 preset's static activation scale (what calibration would leave)
                out[f"{module}.input_scale"] = torch.ones(1, dtype=torch.float32)
        save_file(out, dst / f.name, metadata={"format": "pt"})
        wmap.update({k: f.name for k in out})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    qc = QuantizationConfig(config_groups={"group_0": scheme}, ignore=list(ignore), format=fmt, quantization_status="compressed")
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {"version": __version__, "quant_method": "compressed-tensors", "sparsity_config": {},
                                  "transform_config": {}, **qc.model_dump(exclude=["quant_method"], mode="json")}
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def dequantize(ckpt: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a compressed-tensors checkpoint as the library dequantizes it (BF16 weights).

    Its model-free dequantizer sees names, not module classes: the embedding (not a Linear) is named."""
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import CompressedTensorsDequantizer

    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        tensors.update(load_file(f))
    return CompressedTensorsDequantizer(ckpt, ignore=["model.embed_tokens"]).process(tensors)
