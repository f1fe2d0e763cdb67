"""The fused activation-quantization ops' torch references (Triton: :mod:`.fused_act_quant`).

* ``rmsnorm_act_quant(x [..., K], weight [K], eps, fmt, scale_fmt, rule, order)``: act_quant(RMSNorm(x));
* ``silu_mul_act_quant(gate [..., I], up [..., I], fmt, scale_fmt, rule)``: act_quant(silu(gate) * up);
* ``swiglu_act_quant(gate_up [..., 2I] interleaved, fmt, scale_fmt, rule, alpha, limit)``: act_quant(GPT-OSS SwiGLU).

Each returns E4M3 [..., K] and its format's scales (``fmt``, one of :func:`quantkit.formats.act_formats`): F32
[..., ceil(K/128)] ("fp8-block") or U8 E8M0 [..., K/32] ("mxfp8").
Each is the engine's unfused path with the float32 steps IEEE leaves open fixed, so a kernel matches it bit for bit
anywhere: lane j of 128 adds x[j]**2, x[j + 128]**2, ... in order, then the lanes add pairwise (the engine's mean may
differ in its last bits); exp is Cephes ``expf``, equal to torch's bfloat16 ``silu`` and ``sigmoid`` (tested).
"""

from __future__ import annotations

import torch

from ... import formats
from ...formats import e8m0, fp8_block
from .. import dispatch

ORDERS = ("hf", "f32")  # quantkit.engine.layers.norm.ORDERS
DTYPES = (torch.bfloat16, torch.float32)
SUMSQ_LANES = 128


def f32(v: float) -> float:
    """v rounded to float32, so kernels and torch agree on it."""
    return float(torch.tensor(v, dtype=torch.float32))


# Cephes expf (cephes/single/expf.c): exp(x) = 2**n * P(r), r = x - n*C1 - n*C2, C1 + C2 = ln 2, C1 in 9 bits so n*C1 is exact
EXP_LO, EXP_HI = -104.0, 89.0  # exp rounds to 0 below, overflows above
LOG2E = f32(1.44269504088896341)
EXP_C1 = 0.693359375
EXP_C2 = f32(-2.12194440e-4)
EXP_P = tuple(f32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1))


def exp_f32(x: torch.Tensor) -> torch.Tensor:
    """float32 exp of float32 x (Cephes expf)."""
    xc = x.clamp(EXP_LO, EXP_HI)
    nf = torch.floor(xc * LOG2E + 0.5)
    r = (xc - nf * EXP_C1) - nf * EXP_C2
    p = EXP_P[0] * r + EXP_P[1]
    for c in EXP_P[2:]:
        p = p * r + c
    y = (p * (r * r) + r) + 1.0
    n = torch.nan_to_num(nf).to(torch.int32)  # NaN x: y is NaN already
    n1 = n >> 1  # 2**n in two normal factors: only the last product rounds
    return (y * e8m0.pow2(n1)) * e8m0.pow2(n - n1)


def _div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IEEE a / b (CUDA torch turns `tensor / scalar` into a reciprocal multiply)."""
    return a / b


def sqrt_f32(v: torch.Tensor) -> torch.Tensor:
    """The correctly rounded float32 sqrt (torch's CPU one may miss by an ulp): the float64 root rounded, exact since a
    float32's root lies 2**-50 or more from every float32 midpoint."""
    return torch.sqrt(v.to(torch.float64)).to(torch.float32)


def silu_f32(g: torch.Tensor) -> torch.Tensor:
    """g / (1 + exp(-g)) in float32 (torch's silu)."""
    return _div(g, 1.0 + exp_f32(-g))


def sigmoid_f32(t: torch.Tensor) -> torch.Tensor:
    """1 / (1 + exp(-t)) in float32 (torch's sigmoid)."""
    return _div(torch.ones_like(t), 1.0 + exp_f32(-t))


def sum_squares(xf: torch.Tensor) -> torch.Tensor:
    """float32 [..., K] -> [...]: sum of x**2 in the specified order."""
    k = xf.shape[-1]
    sq = torch.nn.functional.pad(xf * xf, (0, (-k) % SUMSQ_LANES)).unflatten(-1, (-1, SUMSQ_LANES))
    acc = torch.zeros_like(sq[..., 0, :])  # [..., 128]
    for c in range(sq.shape[-2]):
        acc = acc + sq[..., c, :]
    while acc.shape[-1] > 1:
        acc = acc[..., 0::2] + acc[..., 1::2]
    return acc[..., 0]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> torch.Tensor:
    """The engine's RMSNorm with the specified sum of squares."""
    h = x.to(torch.float32)
    mean = _div(sum_squares(h), torch.full(h.shape[:-1], float(h.shape[-1]), device=h.device))
    rstd = _div(torch.ones_like(mean), sqrt_f32(mean + torch.full_like(mean, eps)))
    h = h * rstd[..., None]
    if order == "f32":
        return (weight.to(torch.float32) * h).to(x.dtype)
    return weight * h.to(x.dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The engine's ``F.silu(gate) * up``."""
    return silu_f32(gate.to(torch.float32)).to(gate.dtype) * up


def swiglu(gate_up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """GPT-OSS's clamped SwiGLU, op for op as layers/moe.py."""
    dt = gate_up.dtype
    g = gate_up[..., 0::2].clamp(min=None, max=limit)
    u = gate_up[..., 1::2].clamp(min=-limit, max=limit)
    t = (g.to(torch.float32) * f32(alpha)).to(dt)  # torch's bf16 * scalar
    return (u + 1) * (g * sigmoid_f32(t.to(torch.float32)).to(dt))


def act_quant(y: torch.Tensor, fmt: str, scale_fmt: str, rule: str, scale_mn: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's activation quantization (qlinear.quantize_act): the format's reference."""
    return formats.get(fmt).quantize_act(y, scale_fmt, rule, scale_mn=scale_mn)


# ---- argument checks, shared by every backend so they fail alike


def check_fmt(fmt: str, scale_fmt: str, rule: str, k: int, scale_mn: bool = False) -> None:
    if fmt not in formats.act_formats():
        raise ValueError(f"activation format must be one of {formats.act_formats()}, not {fmt!r}")
    if scale_fmt not in fp8_block.SCALE_FMTS:
        raise ValueError(f"scale format must be one of {fp8_block.SCALE_FMTS}, not {scale_fmt!r}")
    e8m0.check_rule(rule)
    formats.get(fmt).check_act(scale_fmt, k, scale_mn)


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


# ---- the references


def rmsnorm_act_quant(
    x: torch.Tensor, weight: torch.Tensor, eps: float, fmt: str, scale_fmt: str = "float", rule: str = e8m0.DEFAULT_RULE, order: str = "hf",
    *, scale_mn: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """act_quant(RMSNorm(x)); ``scale_mn``: fp8-block scales MN-major, as in every op here."""
    check_norm(x, weight, eps, fmt, scale_fmt, rule, order, scale_mn)
    return act_quant(rms_norm(x, weight, eps, order), fmt, scale_fmt, rule, scale_mn)


def silu_mul_act_quant(
    gate: torch.Tensor, up: torch.Tensor, fmt: str, scale_fmt: str = "float", rule: str = e8m0.DEFAULT_RULE, *, scale_mn: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """act_quant(silu(gate) * up)."""
    check_gate_up(gate, up, fmt, scale_fmt, rule, scale_mn)
    return act_quant(silu_mul(gate, up), fmt, scale_fmt, rule, scale_mn)


def swiglu_act_quant(
    gate_up: torch.Tensor, fmt: str, scale_fmt: str = "float", rule: str = e8m0.DEFAULT_RULE, alpha: float = 1.702, limit: float = 7.0,
    *, scale_mn: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """act_quant(GPT-OSS SwiGLU(gate_up))."""
    check_interleaved(gate_up, fmt, scale_fmt, rule, scale_mn)
    return act_quant(swiglu(gate_up, alpha, limit), fmt, scale_fmt, rule, scale_mn)


OPS = {"rmsnorm_act_quant": rmsnorm_act_quant, "silu_mul_act_quant": silu_mul_act_quant, "swiglu_act_quant": swiglu_act_quant}
for _op, _fn in OPS.items():
    dispatch.register(_op, dispatch.REFERENCE, _fn)
