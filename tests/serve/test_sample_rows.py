"""The batched sampler (``sampling.sample_rows``, what the engine runs where the logits are): the rules of the
one-row sampler, each request's draws fixed by its own seed whatever shares the batch, log-probs of the raw
distribution, one failing row alone.  On the CPU here; the same torch code runs on the GPU.
Budget: under 10 s."""

from __future__ import annotations

import pytest
import torch

from quantkit.serve import sampling
from quantkit.serve.sampling import Draw, SamplingParams, _truncate, adjust, sample_rows

V = 50


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def logits_rows(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, V, generator=gen(seed)) * 2


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=5),
                                    SamplingParams(temperature=1.3, top_p=0.6),
                                    SamplingParams(temperature=2.0, top_k=8, top_p=0.9)])  # top-k and top-p both cut: 7 tokens left
def test_draws_follow_the_one_row_rules(params):
    x = logits_rows(1)[0]
    want = torch.softmax(_truncate(x / params.temperature, params.top_k, params.top_p), -1)
    g = gen(1)
    draws = 3000
    picks, _ = sample_rows(x.expand(draws, V), list(range(draws)), [Draw(params, g)] * draws)
    counts = torch.bincount(torch.tensor([p[0] for p in picks]), minlength=V).float() / draws
    assert counts[want == 0].sum() == 0  # nothing outside top-k / top-p is ever drawn
    assert 0.5 * (counts - want).abs().sum() < 0.05  # total variation: a uniform or argmax sampler is far off


def test_a_seed_gives_the_same_tokens_whatever_shares_the_batch():
    x = logits_rows(4, 2)
    p = SamplingParams(temperature=1.0, seed=7)

    def run(rows: list[int], seeds: list[int], steps: int = 6) -> list[list[int]]:
        gens = [gen(s) for s in seeds]
        out = [[] for _ in rows]
        for _ in range(steps):
            picks, _ = sample_rows(x, rows, [Draw(p, g) for g in gens])
            for o, pk in zip(out, picks):
                o.append(pk[0])
        return out

    alone = run([1], [7])[0]
    crowd = run([0, 1, 3], [3, 7, 9])
    assert crowd[1] == alone and len(set(alone)) > 1  # row 1's request drew the same tokens, and they vary


def test_greedy_banned_bias_and_logprobs():
    x = logits_rows(3, 3)
    top2 = torch.topk(x[0], 2).indices.tolist()
    draws = [
        Draw(SamplingParams(temperature=0, logprobs=3), gen(0)),
        Draw(SamplingParams(temperature=0), gen(0), banned=(top2[0],)),
        Draw(SamplingParams(temperature=0, logit_bias=((11, 100.0),), presence_penalty=1.0), gen(0), output=[4, 4]),
    ]
    carried = torch.tensor([5, 6, 7])
    picks, ids = sample_rows(torch.stack([x[0], x[0], x[1]]), [0, 1, 2], draws, carried)
    assert ids == [5, 6, 7]
    lp = torch.log_softmax(x[0], -1)
    tok, tops, chosen = picks[0]
    assert tok == top2[0] and abs(chosen - lp[tok].item()) < 1e-6
    assert [t for t, _ in tops] == torch.topk(lp, 3).indices.tolist()
    assert picks[1][0] == top2[1] and picks[1][1] == []  # its best token banned: the runner-up
    assert picks[2][0] == int(adjust(x[1], draws[2].params, [], [4, 4]).argmax()) == 11


def test_a_failing_row_fails_alone(monkeypatch):
    real = sampling.prepare_row

    def prepare_row(row, d):
        if d.params.seed == 666:
            raise RuntimeError("boom")
        return real(row, d)

    monkeypatch.setattr(sampling, "prepare_row", prepare_row)
    x = logits_rows(2, 4)
    picks, _ = sample_rows(x, [0, 1], [Draw(SamplingParams(temperature=1.0, seed=666), gen(0)), Draw(SamplingParams(temperature=0), gen(0))])
    assert isinstance(picks[0], RuntimeError) and picks[1][0] == int(x[1].argmax())
