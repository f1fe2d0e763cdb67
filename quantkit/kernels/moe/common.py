"""Triton helpers of both row layouts (:mod:`.fused_moe`, :mod:`.sorted_tokens`): the scaled product step, the bias
and the activation epilogue, each torch op's x.dtype rounding reproduced."""

from __future__ import annotations

import triton
import triton.language as tl

from ..triton_numerics import bf16_round

# The largest float32 whose exp is finite (0x42B17217) in numpy (the interpreter), torch and the GPU's ex2.approx.
EXP_ARG_MAX: tl.constexpr = tl.constexpr(88.72283172607421875)


@triton.jit
def one_plus_exp(a):
    """float32 1 + exp(a), +inf past EXP_ARG_MAX without computing the overflow (numpy warns of it): 1 / inf = 0 and
    g / inf = -0 are torch's sigmoid and silu there."""
    big = a > EXP_ARG_MAX
    return tl.where(big, float("inf"), 1.0 + tl.exp(tl.where(big, 0.0, a)))


@triton.jit
def moe_activation(g, u, ACT: tl.constexpr, alpha, limit, ROUND: tl.constexpr):
    """The engine's activation on x.dtype values, each torch op's rounding reproduced."""
    if ACT == 0:  # silu(g) * u
        s = bf16_round(tl.math.div_rn(g, one_plus_exp(-g)), ROUND)
        return bf16_round(s * u, ROUND)
    g = tl.minimum(g, limit)  # GPT-OSS: (clamp(u) + 1) * g * sigmoid(alpha * g), g <= limit
    u = tl.minimum(tl.maximum(u, -limit), limit)
    sig = bf16_round(tl.math.div_rn(1.0, one_plus_exp(-bf16_round(g * alpha, ROUND))), ROUND)
    return bf16_round(bf16_round(u + 1.0, ROUND) * bf16_round(g * sig, ROUND), ROUND)


@triton.jit
def add_bias(acc, bias_ptr, rows, col_ok, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rows, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def moe_mma(acc, a, w, sa, sw, W_UNIFORM: tl.constexpr, UPCAST: tl.constexpr, UP_DTYPE: tl.constexpr):
    """acc += (a * sa) @ (w * sw), a [BM, K] with row scales, w [K, BN] with one scale (W_UNIFORM) or one per column:
    promoted fp8 dot, or exact upcast operands (power-of-two scales)."""
    # if / else, no early return: Triton traces the code after a return under a constexpr if, and a scalar sw
    # indexed as sw[None, :] there does not compile
    if UPCAST:
        ab = (a.to(tl.float32) * sa[:, None]).to(UP_DTYPE)
        if W_UNIFORM:
            wb = (w.to(tl.float32) * sw).to(UP_DTYPE)
        else:
            wb = (w.to(tl.float32) * sw[None, :]).to(UP_DTYPE)
        out = tl.dot(ab, wb, acc)
    else:
        d = tl.dot(a, w)
        if W_UNIFORM:
            out = acc + d * (sa * sw)[:, None]
        else:
            out = acc + d * (sa[:, None] * sw[None, :])
    return out
