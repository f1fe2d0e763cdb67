"""One rank of the all-to-all exchange test (tests/engine/test_ep_exchange.py): ``python ep_worker.py OUT``
with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set.  Each rank brings its own tokens and routing; experts
are seeded functions of their global id; the rank writes, per mode, its results and the reference to OUT/rank-R.pt."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from quantkit.engine.ep_exchange import AllToAll
from quantkit.formats import fp8_block
from quantkit.kernels.moe.fused_moe_ref import ExpertWeights, MoeSpec, fused_moe_ref

E, K, H = 16, 4, 8
QH, QI = 128, 128  # the fp8-block experts' hidden and intermediate sizes
SPEC = MoeSpec("silu", interleaved=False)


def fp8_experts(rows: int, cols: int, seed: int) -> ExpertWeights:
    q, s = fp8_block.quantize_weight(torch.randn(E, rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.05)
    return ExpertWeights("fp8-block", q, s)


class Fp8Experts:
    """The fused_moe reference over some of the global experts: quantizes its input as the op does."""

    def __init__(self, ids: list[int]) -> None:
        w13, w2 = fp8_experts(2 * QI, QH, 1), fp8_experts(QH, QI, 2)
        self.w13 = ExpertWeights("fp8-block", w13.q[ids], w13.scale[ids])
        self.w2 = ExpertWeights("fp8-block", w2.q[ids], w2.scale[ids])

    def quantize_input(self, x):
        return fp8_block.quantize_act(x)

    def __call__(self, x, w, idx, x_q=None):
        return fused_moe_ref(x, w, idx, self.w13, self.w2, SPEC, x_q=x_q)


def expert_matrix(e: int) -> torch.Tensor:
    return torch.randn(H, H, generator=torch.Generator().manual_seed(1000 + e))


def run_experts(global_ids: list[int]):
    """An ``experts`` callable: x [n, H], weights [n, 1], local ids [n, 1] -> float32 [n, H]."""
    mats = torch.stack([expert_matrix(e) for e in global_ids])

    def experts(x, w, local):
        return torch.tanh(torch.einsum("nh,nhg->ng", x, mats[local[:, 0]])) * w

    return experts


def case(rank: int, world: int, mode: str) -> dict:
    owner = [e * world // E for e in range(E)]  # contiguous blocks of experts per rank
    local = [e for e in range(E) if owner[e] == rank]
    ex = AllToAll(owner, local, capacity=8)
    if mode == "overflow":
        try:
            ex.routed(run_experts(local), torch.randn(9, H), torch.rand(9, K), torch.zeros(9, K, dtype=torch.int64), fixed=True)
        except ValueError as err:
            return {"error": str(err)}
        return {}
    tokens = [5, 0, 3, 7][rank % 4]  # one rank brings no tokens
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(tokens, H, generator=g)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(tokens)]) if tokens else torch.empty(0, K, dtype=torch.int64)
    w = torch.rand(tokens, K, generator=g)
    if mode == "fp8":  # quantized payload: the reference runs every expert on this rank's tokens, quantizing them itself
        x = torch.randn(tokens, QH, generator=g).to(torch.bfloat16)
        y = ex.routed(Fp8Experts(local), x, w, idx)
        ref = fused_moe_ref(x, w, idx, Fp8Experts(list(range(E))).w13, Fp8Experts(list(range(E))).w2, SPEC)
    else:
        y = ex.routed(run_experts(local), x, w, idx, fixed=mode == "fixed")
        ref = torch.zeros(tokens, H)
        for t in range(tokens):
            for s in range(K):
                ref[t] += torch.tanh(x[t] @ expert_matrix(int(idx[t, s]))) * w[t, s]
    pairs = sum(len({owner[int(e)] for e in idx[t]} - {rank}) for t in range(tokens))
    return {"y": y, "ref": ref, "traffic": vars(ex.traffic), "pairs": pairs}


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    torch.save({mode: case(rank, world, mode) for mode in ("variable", "fixed", "overflow", "fp8")}, f"{sys.argv[1]}/rank-{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
