"""The fused MoE's routing and token alignment (kernels/moe/routing.py).

* Routing (kernels/moe_routing.route) is bit-identical to the engine's torch routing for the
  three rules, ties included.
* Alignment: both Triton one-program kernels (pairwise up to SMALL_N_MAX pairs, per-expert
  above) give the same bytes as the torch reference, which satisfies the invariants the GEMMs
  rely on (every pair once, blocks of one expert, padding, worst-case capacity reached by an
  adversarial routing); out-of-range ids fail with torch's error.
* ``pdl`` on the quantization and alignment launches that open the fused MoE changes no byte.
"""

from __future__ import annotations

import pytest
import torch

from quantkit.engine.layers.moe import Routing
from quantkit.engine.layers.moe import route as engine_route
from quantkit.kernels.moe import routing as moe_routing
from quantkit.kernels.moe.routing import SMALL_N_MAX, align, align_capacity, align_torch, align_triton, route


# ---- routing ------------------------------------------------------------------------------------

ROUTINGS = [
    Routing("topk_softmax", 4),
    Routing("softmax_topk", 8, norm_topk_prob=True),
    Routing("softmax_topk", 2, norm_topk_prob=False),
    Routing("grouped_sigmoid", 8, norm_topk_prob=True, n_group=8, topk_group=4, scaling=2.5),
]


@pytest.mark.parametrize("r", ROUTINGS, ids=lambda r: f"{r.rule}-k{r.top_k}")
def test_route_is_bit_identical_to_the_engine(gen, r):
    logits = torch.randn(37, 64, generator=gen) * 3
    logits[::3] = logits[::3].round()  # many exact ties
    bias = torch.randn(64, generator=gen) * 0.1 if r.rule == "grouped_sigmoid" else None
    w_ref, i_ref = engine_route(logits, r, bias)
    w, i = route(logits, r.rule, r.top_k, norm_topk_prob=r.norm_topk_prob, n_group=r.n_group,
                 topk_group=r.topk_group, scaling=r.scaling, correction_bias=bias)  # fmt: skip
    assert torch.equal(i, i_ref) and torch.equal(w.view(torch.int32), w_ref.view(torch.int32))


def test_route_rejects_unknown_rule_and_bad_groups():
    with pytest.raises(ValueError, match="routing rule"):
        route(torch.zeros(1, 8), "sigmoid", 2)
    with pytest.raises(ValueError, match="do not split"):
        route(torch.zeros(1, 10), "grouped_sigmoid", 2, n_group=4)


# ---- alignment ----------------------------------------------------------------------------------


def check_alignment(al, ids: torch.Tensor, e: int) -> None:
    """The invariants the grouped GEMMs rely on."""
    flat, bm = ids.reshape(-1), al.block_m
    n = flat.numel()
    s, ex, used = al.sorted_ids.long(), al.expert_ids.long(), int(al.num_padded)
    assert s.numel() == align_capacity(n, e, bm) and s.numel() % bm == 0 and ex.numel() == s.numel() // bm
    counts = torch.bincount(flat, minlength=e)
    assert used == int(((counts + bm - 1) // bm * bm).sum()) and used % bm == 0
    real = s[s < n]
    assert torch.equal(real.sort().values, torch.arange(n)), "every (token, slot) pair exactly once"
    assert bool((s[used:] == n).all()) and bool((ex[used // bm :] == -1).all()), "padding past the end"
    blocks = s[:used].reshape(-1, bm)
    for b, row in enumerate(blocks):
        assert 0 <= ex[b] < e and bool((flat[row[row < n]] == ex[b]).all()), f"block {b} mixes experts"
    assert bool((ex[: used // bm].diff() >= 0).all()), "experts in ascending order"
    assert bool((real.diff()[(flat[real[1:]] == flat[real[:-1]])] > 0).all()), "token order within an expert"


ALIGN_CASES = [(5, 2, 4, 16), (1, 4, 128, 16), (37, 3, 6, 4), (0, 2, 4, 16), (300, 8, 256, 64), (64, 4, 5, 1), (20, 1, 3, 128)]


def assert_same_bytes(ref, out, what: str = "") -> None:
    for name, a, b in zip(("sorted_ids", "expert_ids", "num_padded"), ref[:3], out[:3]):
        assert a.dtype == b.dtype == torch.int32 and a.shape == b.shape and torch.equal(a, b.cpu()), f"{what} {name}: {b.tolist()} != {a.tolist()}"


@pytest.mark.parametrize("t,k,e,bm", ALIGN_CASES)
def test_align_triton_equals_torch_and_keeps_invariants(triton_device, gen, t, k, e, bm):
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)]) if t else torch.zeros(0, k, dtype=torch.int64)
    ref = align_torch(ids, e, bm)
    check_alignment(ref, ids, e)
    assert_same_bytes(ref, align_triton(ids.to(triton_device, torch.int32 if t % 2 else torch.int64), e, bm))


class LaunchCount:
    """Forwards ``kernel[grid]`` launches and counts them."""

    def __init__(self, kernel) -> None:
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


@pytest.fixture
def launches(monkeypatch) -> dict[str, LaunchCount]:
    """Launch counters on the two alignment kernels: which one ran."""
    spies = {name: LaunchCount(getattr(moe_routing, name)) for name in ("_align_small_kernel", "_align_kernel")}
    for name, spy in spies.items():
        monkeypatch.setattr(moe_routing, name, spy)
    return spies


def routing_ids(kind: str, n: int, e: int, gen: torch.Generator) -> torch.Tensor:
    """int64 expert ids [n / k, k] (k = 4 when it divides n): uniform, a few experts, one expert, or only 0 and E - 1."""
    if kind == "uniform":
        flat = torch.randint(0, e, (n,), generator=gen)
    elif kind == "few":
        flat = torch.randperm(e, generator=gen)[:3][torch.randint(0, min(3, e), (n,), generator=gen)]
    elif kind == "one":
        flat = torch.full((n,), int(torch.randint(0, e, (1,), generator=gen)))
    else:
        flat = torch.randint(0, 2, (n,), generator=gen) * (e - 1)
    return flat.reshape(-1, 4 if n % 4 == 0 else 1)


@pytest.mark.parametrize("bm", [1, 16, 64])
def test_align_small_kernel_equals_torch_on_random_routings(triton_device, gen, launches, bm):
    """n = 1 .. SMALL_N_MAX pairs, E = 1 / not a power of two / 128 / 256, int32 and int64 ids."""
    cases = 0
    for e in (1, 5, 128, 256):
        for kind in ("uniform", "few", "one", "ends"):
            for n in (1, 2, 7, 33, SMALL_N_MAX - 1, SMALL_N_MAX):
                ids = routing_ids(kind, n, e, gen)
                dtype = torch.int32 if cases % 2 else torch.int64
                assert_same_bytes(align_torch(ids, e, bm), align_triton(ids.to(triton_device, dtype), e, bm), f"{kind} n={n} E={e} BM={bm} {dtype}")
                cases += 1
    assert launches["_align_small_kernel"].launches == cases and launches["_align_kernel"].launches == 0


@pytest.mark.parametrize("n", [SMALL_N_MAX, SMALL_N_MAX + 1])
def test_align_kernel_is_picked_by_pair_count(triton_device, gen, launches, n):
    """Up to SMALL_N_MAX pairs the pairwise kernel, above it the per-expert one; the same bytes."""
    e, bm = 256, 16
    ids = routing_ids("uniform", n, e, gen)
    assert_same_bytes(align_torch(ids, e, bm), align_triton(ids.to(triton_device), e, bm), f"n={n}")
    small = n <= SMALL_N_MAX
    assert (launches["_align_small_kernel"].launches, launches["_align_kernel"].launches) == (int(small), int(not small))


@pytest.mark.parametrize("n,kernel", [(100, "_align_small_kernel"), (200, None)])
def test_align_takes_triton_for_few_pairs_whatever_the_expert_count(triton_device, gen, launches, n, kernel):
    """E = 5000: n * E_P2 is past ONE_PROGRAM_MAX, but the pairwise kernel does not depend on E."""
    e, bm = 5000, 16
    ids = routing_ids("uniform", n, e, gen)
    assert_same_bytes(align_torch(ids, e, bm), align(ids.to(triton_device), e, bm), f"n={n}")
    assert {name for name, spy in launches.items() if spy.launches} == ({kernel} if kernel else set())


def test_align_triton_reads_strided_ids(triton_device, gen):
    """A column of [T, k] ids flattens to a strided view; the kernels read contiguous ids."""
    for t in (5, SMALL_N_MAX + 3):
        ids = torch.randint(0, 8, (t, 2), generator=gen)[:, 1:]
        assert_same_bytes(align_torch(ids, 8, 4), align_triton(ids.to(triton_device), 8, 4), f"T={t}")


@pytest.mark.parametrize("n", [4, SMALL_N_MAX + 1])
@pytest.mark.parametrize("bad,dtype", [(-1, torch.int32), (6, torch.int32), (7, torch.int64), (2**32 + 1, torch.int64)])
def test_align_rejects_out_of_range_ids_as_torch_does(n, bad, dtype):
    """Torch's scatter raises for an id outside [0, E) (2**32 + 1 would wrap to 1 in int32); so
    does align_triton, with the same message, before launching (CPU; CUDA asserts on the device)."""
    ids = torch.arange(n).remainder(6).to(dtype).reshape(-1, 1)
    ids[n // 2] = bad
    with pytest.raises(RuntimeError, match="out of bounds") as want:
        align_torch(ids, 6, 16)
    with pytest.raises(RuntimeError) as got:
        align_triton(ids, 6, 16)
    assert str(got.value) == str(want.value)


def test_align_capacity_is_reached_by_the_worst_routing(triton_device):
    """Every expert gets 1 (mod BLOCK_M) pairs: each wastes BLOCK_M - 1 rows, the bound is tight."""
    e, bm = 8, 16
    ids = torch.arange(e * 17).remainder(e).reshape(-1, 1)  # 17 pairs per expert
    al = align_triton(ids.to(triton_device), e, bm)
    assert int(al.num_padded) == align_capacity(ids.numel(), e, bm) == e * 32
    check_alignment(align_torch(ids, e, bm), ids, e)


def test_pdl_is_a_request_with_the_same_bytes(triton_device, gen):
    """``pdl`` on the quantization and alignment launches changes no byte; where programmatic dependent launch does not
    exist (the interpreter, GPUs before sm_90) the request is dropped instead of failing."""
    from quantkit.kernels.quant.group_quant import act_quant_fp8_block, mxfp8_quantize

    x = torch.randn(5, 320, generator=gen).to(triton_device)
    for quant in (act_quant_fp8_block, mxfp8_quantize):
        (q0, s0), (q1, s1) = quant(x), quant(x, pdl=True)
        assert torch.equal(q0.view(torch.uint8), q1.view(torch.uint8)) and torch.equal(s0, s1), quant.__name__
    ids = torch.randint(0, 8, (5, 4), generator=gen).to(triton_device)
    plain, dep = moe_routing.align_triton(ids, 8, 16), moe_routing.align_triton(ids, 8, 16, pdl=True)
    assert all(torch.equal(a, b) for a, b in zip(plain[:3], dep[:3]))
