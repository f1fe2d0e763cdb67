"""How each source projection is stored, from the source's ``quantization_config``.

* none, or ``quant_method: mxfp4`` (GPT-OSS: its experts are found by their ``_blocks`` names):
  every Linear module is plain (BF16/F16/F32).
* ``quant_method: fp8`` (HF/DeepSeek fine-grained FP8, Qwen's FP8 releases): the projections the
  family quantizes are 128x128 blocks with ``weight_scale_inv``, but for ``modules_to_not_convert``.
* ``quant_method: compressed-tensors`` (llm-compressor's outputs, quantkit's own ``--to mxfp8``):
  a Linear module is quantized by the first config group whose ``targets`` match it, unless
  ``ignore`` matches it.  Matching is compressed-tensors' (``utils/match.py``): a target is a module
  name, ``re:<regex>`` (``re.match`` on the module name), or the class name ``Linear`` (every
  Linear module).  The group's ``weights`` arguments give the stored layout:

  | weights args                                   | kind        | tensors beside ``weight``                    |
  |------------------------------------------------|-------------|----------------------------------------------|
  | float 8 bits, strategy block [128, 128]        | fp8-block   | ``weight_scale`` F32/BF16 [ceil(N/128), ceil(K/128)] |
  | float 8 bits, strategy channel (FP8_DYNAMIC)   | fp8-channel | ``weight_scale`` F32/BF16 [N, 1]              |
  | float 8 bits, strategy tensor (FP8)            | fp8-channel | ``weight_scale`` [1] (+ static ``input_scale``, read and dropped) |
  | float 8 bits, group 32, uint8 scales (MXFP8)   | mxfp8       | ``weight_scale`` U8 E8M0 [N, K/32]            |
  | float 4 bits, group 32, uint8 scales (MXFP4)   | mxfp4       | ``weight_packed`` U8 [N, K/2] instead of ``weight``, ``weight_scale`` U8 [N, K/32] |

  ``weight_packed`` holds element 2j in the low nibble (``pack_fp4_to_uint8``): GPT-OSS's order, so
  its rows are GPT-OSS's ``_blocks`` bytes.  Anything else (integer, asymmetric, NVFP4, other block
  sizes, sparsity, transforms, a KV-cache scheme, a status other than ``compressed``) is refused.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from ..checkpoint import CheckpointError

TILE = 128
MX = 32


@dataclass(frozen=True)
class Stored:
    kind: str  # "plain" | "fp8-block" | "fp8-channel" | "mxfp8" | "mxfp4"
    weight: str = "weight"  # parameter name of the stored weight
    scale: str | None = None  # parameter name of its scale
    dropped: tuple[str, ...] = ()  # parameters read past and not converted (static activation scales)


PLAIN = Stored("plain")
FP8_BLOCK = Stored("fp8-block", scale="weight_scale_inv")


def _weights_kind(args: dict, group: str, where: str) -> Stored:
    """The stored layout of a compressed-tensors group's ``weights`` arguments; an error for any other."""
    bits, typ, strategy = args.get("num_bits"), args.get("type"), args.get("strategy")
    rule = f"{where}: quantization_config config_groups.{group}.weights"
    if typ != "float" or not args.get("symmetric", True) or args.get("dynamic"):
        raise CheckpointError(f"{rule} is {typ}, symmetric={args.get('symmetric')}, dynamic={args.get('dynamic')}; "
                              "only static symmetric float weights (FP8, FP8_DYNAMIC, FP8_BLOCK, MXFP8, MXFP4) are read")
    scale_u8 = str(args.get("scale_dtype")) in ("torch.uint8", "uint8")
    if bits == 8 and strategy == "block":
        if list(args.get("block_structure") or []) != [TILE, TILE]:
            raise CheckpointError(f"{rule}: block_structure {args.get('block_structure')} is not supported; only [128, 128]")
        return Stored("fp8-block", scale="weight_scale")
    if bits == 8 and strategy in ("channel", "tensor"):
        return Stored("fp8-channel", scale="weight_scale", dropped=("input_scale",))
    if strategy == "group" and args.get("group_size") == MX and scale_u8 and bits in (8, 4):
        return Stored("mxfp8", scale="weight_scale") if bits == 8 else Stored("mxfp4", weight="weight_packed", scale="weight_scale")
    raise CheckpointError(f"{rule}: {bits}-bit float with strategy {strategy!r}, group_size {args.get('group_size')}, "
                          f"scale_dtype {args.get('scale_dtype')} is not supported; read are FP8 (tensor, channel, 128x128 block), "
                          "MXFP8 and MXFP4 (group 32, uint8 E8M0 scales)")


def _match(module: str, target: str) -> bool:
    """compressed-tensors' rule; every module asked about here is a Linear module."""
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    return target in (module, "Linear")


class SourceScheme:
    """Answers :meth:`stored` for each Linear module of one source checkpoint."""

    def __init__(self, config: dict, where: str) -> None:
        q = config.get("quantization_config") or {}
        self.method = q.get("quant_method")
        self.skip: tuple[str, ...] = ()
        self.groups: list[tuple[list[str], Stored]] = []
        self.ignore: list[str] = []
        if self.method in (None, "mxfp4"):
            return
        if self.method == "fp8":
            if list(q.get("weight_block_size") or []) != [TILE, TILE]:
                raise CheckpointError(f"{where}: FP8 weight_block_size {q.get('weight_block_size')} is not supported; only [128, 128]")
            self.skip = tuple(q.get("modules_to_not_convert") or ())
        elif self.method == "compressed-tensors":
            self._compressed_tensors(q, where)
        else:
            raise CheckpointError(f"{where}: source quantization_config quant_method {self.method!r} is not supported; supported: "
                                  "fp8 (128x128 blocks), mxfp4 (GPT-OSS), compressed-tensors (FP8, FP8_DYNAMIC, FP8_BLOCK, MXFP8, MXFP4), or none")

    def _compressed_tensors(self, q: dict, where: str) -> None:
        status = q.get("quantization_status", "compressed")
        if status != "compressed":
            raise CheckpointError(f"{where}: compressed-tensors quantization_status {status!r}; only 'compressed' checkpoints are read")
        for key in ("sparsity_config", "transform_config", "kv_cache_scheme"):
            if q.get(key):
                raise CheckpointError(f"{where}: compressed-tensors {key} is set; checkpoints with {key.split('_')[0]} "
                                      "settings are not read (their weights do not mean what they say without it)")
        for name, g in (q.get("config_groups") or {}).items():
            if g.get("weights") is None:
                raise CheckpointError(f"{where}: compressed-tensors config_groups.{name} quantizes no weights; not supported")
            self.groups.append((list(g.get("targets") or []), _weights_kind(g["weights"], name, where)))
        self.ignore = list(q.get("ignore") or [])

    def scale_fmt(self, q: dict) -> str | None:
        """The fp8-block scale format the source declares ("float" or "ue8m0"), None when it has no FP8 blocks."""
        if self.method == "fp8":
            return "ue8m0" if q.get("scale_fmt") == "ue8m0" else "float"
        if any(s.kind == "fp8-block" for _, s in self.groups):
            return "float"  # compressed-tensors stores float block scales (F32 or BF16)
        return None

    def stored(self, module: str, quantizable: bool) -> Stored:
        """How Linear module ``module`` is stored; ``quantizable``: the family quantizes it (quant_method
        fp8 covers only those, compressed-tensors every Linear its config names)."""
        if self.method == "fp8":
            skipped = any(module == s or fnmatch.fnmatchcase(module, s) or module.startswith(s + ".") for s in self.skip)
            return FP8_BLOCK if quantizable and not skipped else PLAIN
        if any(_match(module, i) for i in self.ignore):
            return PLAIN
        for targets, kind in self.groups:
            if any(_match(module, t) for t in targets):
                return kind
        return PLAIN


def source_scale_fmt(config: dict, where: str = "config.json") -> str | None:
    """The fp8-block scale format a source declares ("float" or "ue8m0"), None when not FP8 blocks."""
    q = config.get("quantization_config") or {}
    return SourceScheme(config, where).scale_fmt(q)
