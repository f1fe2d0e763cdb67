"""The fused activation-quantization ops: their arithmetic, written out in torch, and their
registration as the ``"torch"`` reference (the Triton backends live in :mod:`.fused_act_quant`).

| op                    | input                                         | returns                               |
|-----------------------|-----------------------------------------------|---------------------------------------|
| ``rmsnorm_act_quant`` | x [..., K], weight [K], eps, fmt, scale_fmt, rule, order | q E4M3 [..., K] + scales of rmsnorm(x) |
| ``silu_mul_act_quant``| gate [..., I], up [..., I], fmt, scale_fmt, rule | q E4M3 [..., I] + scales of silu(gate) * up |
| ``swiglu_act_quant``  | gate_up [..., 2I] interleaved (GPT-OSS), fmt, scale_fmt, rule, alpha, limit | q E4M3 [..., I] + scales |

``fmt`` "fp8-block": DeepSeek act_quant per token per 128 channels, F32 scales [..., ceil(K/128)]
(``scale_fmt`` "float" or "ue8m0"; :func:`formats.fp8_block.quantize_act`); "mxfp8": 1x32 E4M3 +
U8 E8M0 [..., K/32] (:func:`formats.mxfp8.quantize`).  ``rule``: the E8M0 rule of mxfp8 and ue8m0.
A concatenated [gate | up] tensor is passed to ``silu_mul_act_quant`` as its two halves (views).

Each op is the engine's unfused path -- RMSNorm (quantkit/engine/layers/norm.py) or the MLP/expert
activation (layers/mlp.py, layers/moe.py), rounded to the activation dtype, then the act-quant
reference -- with the two steps whose float32 result is not fixed by IEEE specified here, so a
kernel can reproduce them bit for bit on every device:

* RMSNorm's sum of squares: lane j of :data:`SUMSQ_LANES` accumulates x[j], x[j + 128], ... in
  order (x zero-padded to whole 128-chunks), then the lanes are added pairwise (j, j + 1) in
  log2(128) rounds.  torch's own reduction order differs by device and size, so the engine's
  ``mean(x**2)`` may differ from this in the last float32 bits.  Then mean = sum / K and
  rstd = 1 / sqrt(mean + eps), each an IEEE float32 operation (torch CPU's rsqrt is that too,
  its float32 ``sqrt`` is not: :func:`sqrt_f32`);
* exp in SiLU and sigmoid: Cephes ``expf`` (range reduction by ln 2 in two parts, a degree-5
  polynomial, scaling by 2**n in two exact steps), in float32 +, -, * only: within 1 ulp of
  exp, and equal to torch's bfloat16 ``silu`` and ``sigmoid`` for every bfloat16 input (tested).

The activation dtype is the engine's: RMSNorm's output dtype (order "hf": weight * h.to(x.dtype),
i.e. the promotion of weight and x; "f32": x.dtype), the MLP's gate/up dtype.  Inputs are
bfloat16 or float32.
"""

from __future__ import annotations

import torch

from ...formats import e8m0, fp8_block, mxfp8
from .. import dispatch

FORMATS = ("fp8-block", "mxfp8")
ORDERS = ("hf", "f32")  # quantkit.engine.layers.norm.ORDERS
DTYPES = (torch.bfloat16, torch.float32)
SUMSQ_LANES = 128  # lanes of the sum of squares (see the module docstring)


def f32(v: float) -> float:
    """v rounded to the nearest float32, as a Python float (kernels and torch then agree on it)."""
    return float(torch.tensor(v, dtype=torch.float32))


# Cephes expf (cephes/single/expf.c): exp(x) = 2**n * P(r), n = floor(x log2 e + 1/2),
# r = x - n*C1 - n*C2 with C1 + C2 = ln 2 (C1 exact in 9 bits, so n*C1 is exact).
EXP_LO, EXP_HI = -104.0, 89.0  # clamp: exp(-104) rounds to 0, exp(89) overflows to inf
LOG2E = f32(1.44269504088896341)
EXP_C1 = 0.693359375
EXP_C2 = f32(-2.12194440e-4)
EXP_P = tuple(f32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1))


def exp_f32(x: torch.Tensor) -> torch.Tensor:
    """float32 exp of float32 x (Cephes expf, see above); NaN -> NaN, +-inf -> inf / 0."""
    xc = x.clamp(EXP_LO, EXP_HI)
    nf = torch.floor(xc * LOG2E + 0.5)
    r = (xc - nf * EXP_C1) - nf * EXP_C2
    p = EXP_P[0] * r + EXP_P[1]
    for c in EXP_P[2:]:
        p = p * r + c
    y = (p * (r * r) + r) + 1.0
    n = torch.nan_to_num(nf).to(torch.int32)  # NaN x: y is NaN already
    n1 = n >> 1  # 2**n = 2**n1 * 2**(n - n1), both normal: exact until the last product rounds
    return (y * e8m0.pow2(n1)) * e8m0.pow2(n - n1)


def _div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IEEE a / b (a tensor divisor: CUDA torch turns `tensor / scalar` into a reciprocal multiply)."""
    return a / b


def sqrt_f32(v: torch.Tensor) -> torch.Tensor:
    """The correctly rounded float32 square root (IEEE ``sqrt``; torch's float32 sqrt on CPU goes
    through MKL and may miss it by an ulp): the float64 root rounded once more is exact, because a
    float32's root lies at least 2**-50 (relative) from every float32 midpoint."""
    return torch.sqrt(v.to(torch.float64)).to(torch.float32)


def silu_f32(g: torch.Tensor) -> torch.Tensor:
    """torch's silu formula g / (1 + exp(-g)) in float32, with :func:`exp_f32`."""
    return _div(g, 1.0 + exp_f32(-g))


def sigmoid_f32(t: torch.Tensor) -> torch.Tensor:
    """torch's sigmoid formula 1 / (1 + exp(-t)) in float32, with :func:`exp_f32`."""
    return _div(torch.ones_like(t), 1.0 + exp_f32(-t))


def sum_squares(xf: torch.Tensor) -> torch.Tensor:
    """float32 [..., K] -> [...]: sum of x**2 in the specified order (module docstring)."""
    k = xf.shape[-1]
    sq = torch.nn.functional.pad(xf * xf, (0, (-k) % SUMSQ_LANES)).unflatten(-1, (-1, SUMSQ_LANES))
    acc = torch.zeros_like(sq[..., 0, :])  # [..., 128]
    for c in range(sq.shape[-2]):
        acc = acc + sq[..., c, :]
    while acc.shape[-1] > 1:
        acc = acc[..., 0::2] + acc[..., 1::2]
    return acc[..., 0]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> torch.Tensor:
    """quantkit's RMSNorm with the specified sum of squares, in the engine's output dtype."""
    h = x.to(torch.float32)
    mean = _div(sum_squares(h), torch.full(h.shape[:-1], float(h.shape[-1]), device=h.device))
    rstd = _div(torch.ones_like(mean), sqrt_f32(mean + torch.full_like(mean, eps)))
    h = h * rstd[..., None]
    if order == "f32":
        return (weight.to(torch.float32) * h).to(x.dtype)
    return weight * h.to(x.dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The engine's ``F.silu(gate) * up`` in the dtype of gate and up."""
    return silu_f32(gate.to(torch.float32)).to(gate.dtype) * up


def swiglu(gate_up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """GPT-OSS's clamped SwiGLU on interleaved gate_up [..., 2I] (row 2j gate, 2j+1 up) in its dtype,
    op for op as layers/moe.py: (u + 1) * (g * sigmoid(g * alpha)), g = min(gate, limit), u clamped."""
    dt = gate_up.dtype
    g = gate_up[..., 0::2].clamp(min=None, max=limit)
    u = gate_up[..., 1::2].clamp(min=-limit, max=limit)
    t = (g.to(torch.float32) * f32(alpha)).to(dt)  # torch's bf16 * scalar: float32 product, rounded
    return (u + 1) * (g * sigmoid_f32(t.to(torch.float32)).to(dt))


def act_quant(y: torch.Tensor, fmt: str, scale_fmt: str, rule: str, scale_mn: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's dynamic activation quantization (quantkit/engine/qlinear.py quantize_act)."""
    if fmt == "fp8-block":
        return fp8_block.quantize_act(y, scale_fmt, rule, scale_mn=scale_mn)
    return mxfp8.quantize(y, rule)


# ---- argument checks (shared by every backend, so they fail alike) ------------------------------


def check_fmt(fmt: str, scale_fmt: str, rule: str, k: int, scale_mn: bool = False) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"activation format must be one of {FORMATS}, not {fmt!r}")
    if scale_fmt not in fp8_block.SCALE_FMTS:
        raise ValueError(f"scale format must be one of {fp8_block.SCALE_FMTS}, not {scale_fmt!r}")
    e8m0.check_rule(rule)
    if fmt == "mxfp8" and k % mxfp8.BLOCK:
        raise ValueError(f"MXFP8 needs K to be a multiple of {mxfp8.BLOCK}, got {k}")
    if scale_mn and fmt != "fp8-block":
        raise ValueError(f"MN-major scales (scale_mn) are an fp8-block layout, not {fmt}'s")


def _check_dtype(what: str, t: torch.Tensor) -> None:
    if t.dtype not in DTYPES:
        raise ValueError(f"{what}: dtype must be one of {DTYPES}, got {t.dtype}")


def check_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, fmt: str, scale_fmt: str, rule: str, order: str, scale_mn: bool = False) -> None:
    if x.dim() < 1 or x.shape[-1] == 0 or tuple(weight.shape) != (x.shape[-1],):
        raise ValueError(f"rmsnorm_act_quant: x must be [..., K] with K > 0 and weight [K], got {tuple(x.shape)} and {tuple(weight.shape)}")
    _check_dtype("rmsnorm_act_quant x", x)
    _check_dtype("rmsnorm_act_quant weight", weight)
    if order not in ORDERS:
        raise ValueError(f"RMSNorm order must be one of {ORDERS}, not {order!r}")
    if not eps > 0:
        raise ValueError(f"rmsnorm_act_quant: eps must be positive, got {eps}")
    check_fmt(fmt, scale_fmt, rule, x.shape[-1], scale_mn)


def check_gate_up(gate: torch.Tensor, up: torch.Tensor, fmt: str, scale_fmt: str, rule: str, scale_mn: bool = False) -> None:
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.dim() < 1 or gate.shape[-1] == 0:
        raise ValueError(f"silu_mul_act_quant: gate and up must be [..., I] (I > 0) of one shape and dtype, got {gate.dtype}{tuple(gate.shape)} and {up.dtype}{tuple(up.shape)}")
    _check_dtype("silu_mul_act_quant gate/up", gate)
    check_fmt(fmt, scale_fmt, rule, gate.shape[-1], scale_mn)


def check_interleaved(gate_up: torch.Tensor, fmt: str, scale_fmt: str, rule: str, scale_mn: bool = False) -> None:
    if gate_up.dim() < 1 or gate_up.shape[-1] == 0 or gate_up.shape[-1] % 2:
        raise ValueError(f"swiglu_act_quant: gate_up must be [..., 2I] (interleaved gate/up, I > 0), got {tuple(gate_up.shape)}")
    _check_dtype("swiglu_act_quant gate_up", gate_up)
    check_fmt(fmt, scale_fmt, rule, gate_up.shape[-1] // 2, scale_mn)


# ---- the ops' references ------------------------------------------------------------------------


def rmsnorm_act_quant(
    x: torch.Tensor, weight: torch.Tensor, eps: float, fmt: str, scale_fmt: str = "float", rule: str = e8m0.DEFAULT_RULE, order: str = "hf",
    *, scale_mn: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """act_quant(RMSNorm(x)): (E4M3 [..., K], scales [..., ceil(K/128)] F32 or [..., K/32] U8); ``scale_mn``:
    fp8-block scales MN-major (:func:`quantkit.formats.fp8_block.empty_act_scales`), as in every op here."""
    check_norm(x, weight, eps, fmt, scale_fmt, rule, order, scale_mn)
    return act_quant(rms_norm(x, weight, eps, order), fmt, scale_fmt, rule, scale_mn)


def silu_mul_act_quant(
    gate: torch.Tensor, up: torch.Tensor, fmt: str, scale_fmt: str = "float", rule: str = e8m0.DEFAULT_RULE, *, scale_mn: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """act_quant(silu(gate) * up): (E4M3 [..., I], scales)."""
    check_gate_up(gate, up, fmt, scale_fmt, rule, scale_mn)
    return act_quant(silu_mul(gate, up), fmt, scale_fmt, rule, scale_mn)


def swiglu_act_quant(
    gate_up: torch.Tensor, fmt: str, scale_fmt: str = "float", rule: str = e8m0.DEFAULT_RULE, alpha: float = 1.702, limit: float = 7.0,
    *, scale_mn: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """act_quant(GPT-OSS SwiGLU(gate_up)) for interleaved gate_up [..., 2I]: (E4M3 [..., I], scales)."""
    check_interleaved(gate_up, fmt, scale_fmt, rule, scale_mn)
    return act_quant(swiglu(gate_up, alpha, limit), fmt, scale_fmt, rule, scale_mn)


OPS = {"rmsnorm_act_quant": rmsnorm_act_quant, "silu_mul_act_quant": silu_mul_act_quant, "swiglu_act_quant": swiglu_act_quant}
for _op, _fn in OPS.items():
    dispatch.register(_op, dispatch.REFERENCE, _fn)
