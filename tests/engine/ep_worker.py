"""One rank of the all-to-all exchange test (tests/engine/test_ep_exchange.py): ``python ep_worker.py OUT``
with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set.  Each rank brings its own tokens and routing; experts
are seeded functions of their global id; the rank writes, per mode, its results and the reference to OUT/rank-R.pt."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from quantkit.engine.ep_exchange import AllToAll

E, K, H = 16, 4, 8


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
    torch.save({mode: case(rank, world, mode) for mode in ("variable", "fixed", "overflow")}, f"{sys.argv[1]}/rank-{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
