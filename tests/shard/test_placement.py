"""Expert placement: contiguous (DeepSeek convert.py), round-robin, balanced from a load histogram."""

from __future__ import annotations

import json

import pytest

from quantkit.shard import ShardError
from quantkit.shard.placement import load_stats, local_experts, place, read_load


def test_contiguous_is_convert_py():
    """convert.py keeps expert idx on rank i unless idx < i*n_local or idx >= (i+1)*n_local."""
    emap = place("contiguous", [3, 4], 256, 16, None)
    n_local = 256 // 16
    for i in range(16):
        kept = [idx for idx in range(256) if not (idx < i * n_local or idx >= (i + 1) * n_local)]
        assert local_experts(emap, i) == {3: kept, 4: kept}


def test_round_robin():
    emap = place("round-robin", [0], 8, 4, None)
    assert emap[0] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert local_experts(emap, 1) == {0: [1, 5]}


def test_balanced_spreads_hot_experts():
    # experts 0..3 are hot: contiguous puts them all on rank 0 of 4
    counts = [100.0, 90, 80, 70, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    load = {5: counts}
    contiguous = load_stats(place("contiguous", [5], 16, 4, load), load, 4)
    emap = place("balanced", [5], 16, 4, load)
    balanced = load_stats(emap, load, 4)
    assert sorted(emap[5][:4]) == [0, 1, 2, 3]  # one hot expert per rank
    assert all(emap[5].count(r) == 4 for r in range(4))  # equal expert counts
    assert contiguous["max_over_mean_worst_layer"] == pytest.approx(340 / 88)
    # the optimum: expert 0 (100) plus three cold experts on one rank
    assert balanced["max_over_mean_worst_layer"] == pytest.approx(103 / 88)


def test_balanced_is_deterministic_on_ties():
    load = {0: [1.0] * 8}
    # equal loads: lower expert id first, to the lowest rank among the least loaded
    assert place("balanced", [0], 8, 4, load)[0] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_placement_errors():
    with pytest.raises(ShardError, match="do not divide over --ep 3"):
        place("contiguous", [0], 8, 3, None)
    with pytest.raises(ShardError, match="needs --expert-load"):
        place("balanced", [0], 8, 4, None)
    with pytest.raises(ShardError, match="--placement must be one of"):
        place("random", [0], 8, 4, None)


def test_read_load(tmp_path):
    p = tmp_path / "load.json"
    p.write_text(json.dumps({"layers": {"1": [1, 2, 3, 4], "2": [0, 0, 0, 5]}}))
    assert read_load(p, [1, 2], 4) == {1: [1.0, 2.0, 3.0, 4.0], 2: [0.0, 0.0, 0.0, 5.0]}
    p.write_text(json.dumps({"1": [1, 2, 3, 4], "2": [0, 0, 0, 5]}))  # the wrapper is optional
    assert read_load(p, [1, 2], 4)[2] == [0.0, 0.0, 0.0, 5.0]


@pytest.mark.parametrize("data,msg", [
    ({"1": [1, 2, 3, 4]}, r"no counts for MoE layer\(s\) 2"),
    ({"1": [1, 2, 3], "2": [1, 2, 3, 4]}, "layer 1: expected a list of 4"),
    ({"1": [1, 2, 3, -4], "2": [1, 2, 3, 4]}, "non-negative"),
    ({"1": [1, 2, 3, 4], "2": [1, 2, 3, 4], "7": [1, 1, 1, 1]}, "layer '7' is not a MoE layer"),
    ([1, 2], "expected"),
])
def test_read_load_errors(tmp_path, data, msg):
    p = tmp_path / "load.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ShardError, match=msg):
        read_load(p, [1, 2], 4)


def test_read_load_not_json(tmp_path):
    p = tmp_path / "load.json"
    p.write_text("{oops")
    with pytest.raises(ShardError, match="cannot read expert-load JSON"):
        read_load(p, [1], 4)
