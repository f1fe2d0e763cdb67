"""All-to-all expert dispatch and combine (:mod:`quantkit.engine.ep_exchange`) over gloo, four processes:
every rank's MoE output equals the sum over its tokens' experts computed in one process, with variable
splits, with fixed capacity and with an FP8 payload, and the variable exchange moves exactly the routed
(token, rank) pairs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from quantkit.engine.ep_exchange import row_bytes

WORKER = Path(__file__).with_name("ep_worker.py")
WORLD, H, K = 4, 8, 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, list[dict]]:
    """mode -> every rank's results, from one launch of four processes."""
    got = run(tmp_path_factory.mktemp("ep"))
    return {mode: [r[mode] for r in got] for mode in ("variable", "fixed", "overflow", "fp8")}


def run(tmp_path: Path) -> list[dict]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(WORLD),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(tmp_path)], env={**env, "RANK": str(r)},
                              stderr=subprocess.PIPE, text=True) for r in range(WORLD)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    return [torch.load(tmp_path / f"rank-{r}.pt") for r in range(WORLD)]


@pytest.mark.parametrize("mode", ["variable", "fixed"])
def test_all_to_all_equals_every_expert_in_one_process(results, mode):
    results = results[mode]
    for r, res in enumerate(results):
        assert res["y"].shape == res["ref"].shape, r
        torch.testing.assert_close(res["y"], res["ref"], rtol=1e-5, atol=1e-5, msg=f"rank {r}")
    sent = {ph: sum(res["traffic"][f"{ph}_sent"] for res in results) for ph in ("dispatch", "combine")}
    received = {ph: sum(res["traffic"][f"{ph}_received"] for res in results) for ph in ("dispatch", "combine")}
    assert sent == received  # every byte sent is received
    row = H * 4 + K * 8 + K * 4  # a token's hidden state (float32 here), its k ids (int64) and k weights
    assert row_bytes(H, K, "f32") == row
    if mode == "variable":  # one row per (token, other rank holding one of its experts): a token is sent to a rank once
        for r, res in enumerate(results):
            assert res["traffic"]["dispatch_sent"] == res["pairs"] * row, r
        assert sent["combine"] == sum(res["pairs"] for res in results) * H * 4  # one float32 partial back per row
    else:  # capacity 8 rows to each of the 3 other ranks, used or not
        for r, res in enumerate(results):
            assert res["traffic"]["dispatch_sent"] == 3 * 8 * row, r
            assert res["traffic"]["combine_sent"] == 3 * 8 * H * 4, r


def test_fixed_capacity_refuses_more_tokens_than_it_holds(results):
    for res in results["overflow"]:
        assert res["error"] == "fixed-capacity exchange: 9 tokens on this rank, capacity 8"


def test_fp8_payload_is_what_the_experts_consume(results):
    """fp8-block experts: rows travel as E4M3 + float32 1x128 scales (quantized once by the sender, the
    receiver's op takes them as they are) and every rank's output is every expert's in one process."""
    for r, res in enumerate(results["fp8"]):
        assert res["y"].dtype == torch.bfloat16
        torch.testing.assert_close(res["y"].float(), res["ref"].float(), rtol=2**-7, atol=1e-3, msg=f"rank {r}")
        row = 128 * 1 + 4 + K * 8 + K * 4  # 128 E4M3 bytes, one float32 scale, the ids and weights
        assert row_bytes(128, K, "fp8-block") == row
        assert res["traffic"]["dispatch_sent"] == res["pairs"] * row, r
