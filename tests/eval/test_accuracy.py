"""``quantkit eval accuracy`` end to end on a tiny synthetic Qwen3: transformers (F32) as the
reference, the engine on candidates; layer indexing, the gate's exit codes, JSON, plot, errors."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from quantkit.cli import main
from quantkit.eval.accuracy import evaluate
from quantkit.eval.reference import TransformersRunner

FAST = ["--tokens", "256", "--ctx", "64", "--no-progress"]


def synth(family: str, dst: Path) -> Path:
    res = CliRunner().invoke(main, ["synth", family, str(dst), "--preset", "tiny"])
    assert res.exit_code == 0, res.output
    return dst


def noised(src: Path, dst: Path, rel: float, seed: int = 0) -> Path:
    """A copy of ``src`` whose linear projection weights carry relative Gaussian noise."""
    shutil.copytree(src, dst)
    (dst / "quantkit.json").unlink()  # its checksums describe the source's bytes
    g = torch.Generator().manual_seed(seed)
    for f in dst.glob("*.safetensors"):
        t = load_file(f)
        for k, v in t.items():
            if k.endswith("_proj.weight"):
                n = torch.randn(v.shape, generator=g) * v.float().std() * rel
                t[k] = (v.float() + n).to(v.dtype)
        save_file(t, f, metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("eval")
    src = synth("qwen3", d / "qwen3")
    yield {"src": src, "noisy": noised(src, d / "noisy", 0.05), "noisier": noised(src, d / "noisier", 0.3, seed=1)}
    shutil.rmtree(d, ignore_errors=True)


def test_engine_on_source_matches_transformers_and_layers_align(ckpts):
    rep = evaluate([str(ckpts["src"])], str(ckpts["src"]), tokens=256, ctx=64, progress="off")
    s = rep.candidates[0].summary
    assert s.kld_mean < 1e-9 and s.top1_pct == 100.0 and abs(s.ppl_ratio - 1) < 1e-6
    n_layers = json.loads((ckpts["src"] / "config.json").read_text())["num_hidden_layers"]
    assert len(s.hidden_rel_err) == n_layers + 1
    assert max(s.hidden_rel_err) < 1e-5
    # an off-by-one in the indexing could not pass: neighbouring points of the stream differ a lot
    ref = TransformersRunner(ckpts["src"]).forward(torch.arange(32))
    for a, b in zip(ref.hidden, ref.hidden[1:]):
        assert float((b - a).norm() / a.norm()) > 0.01


def test_noise_orders_candidates_and_table_is_side_by_side(ckpts):
    res = CliRunner().invoke(main, ["eval", "accuracy", str(ckpts["noisy"]), str(ckpts["noisier"]),
                                    "--reference", str(ckpts["src"]), *FAST, "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    a, b = rep["candidates"]
    assert (a["name"], b["name"]) == ("noisy", "noisier")
    assert 0 < a["kld_mean"] < b["kld_mean"]
    assert a["kld_median"] <= a["kld_p95"] <= a["kld_p99"] <= a["kld_p999"] <= a["kld_max"]
    assert rep["n_scored"] == 4 * 31 and a["n_tokens"] == 4 * 31
    assert a["hidden_rel_err"][0] == 0.0  # embeddings are not noised
    assert 0 < a["hidden_rel_err"][1] < b["hidden_rel_err"][1]
    md = CliRunner().invoke(main, ["eval", "accuracy", str(ckpts["noisy"]), str(ckpts["noisier"]),
                                   "--reference", str(ckpts["src"]), *FAST])
    assert md.exit_code == 0, md.output
    assert "| metric | noisy | noisier |" in md.stdout and "| layer 1 |" in md.stdout


@pytest.mark.parametrize(
    ("gate", "code"),
    [(["--max-kld", "10"], 0), (["--max-kld", "1e-9"], 1), (["--min-top1", "0"], 0), (["--min-top1", "100"], 1),
     (["--max-kld", "10", "--min-top1", "100"], 1)],
)
def test_gate_exit_codes(ckpts, gate, code):
    res = CliRunner().invoke(main, ["eval", "accuracy", str(ckpts["noisier"]), "--reference", str(ckpts["src"]), *FAST, *gate])
    assert res.exit_code == code, res.output
    assert ("FAIL" in res.stdout) == (code == 1) and ("pass" in res.stdout) == (code == 0)


def test_gate_fails_if_any_candidate_fails(ckpts):
    res = CliRunner().invoke(main, ["eval", "accuracy", str(ckpts["src"]), str(ckpts["noisier"]),
                                    "--reference", str(ckpts["src"]), *FAST, "--max-kld", "1e-6", "--json"])
    assert res.exit_code == 1
    rep = json.loads(res.stdout)
    assert [c["passed"] for c in rep["candidates"]] == [True, False] and rep["passed"] is False
    assert "--max-kld" in rep["candidates"][1]["failures"][0]


def test_plot_without_matplotlib_fails_before_running(ckpts, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    res = CliRunner().invoke(main, ["eval", "accuracy", str(ckpts["noisy"]), "--reference", str(ckpts["src"]),
                                    *FAST, "--plot", str(tmp_path / "k.png")])
    assert res.exit_code == 1
    assert "needs matplotlib" in res.output and "mean KLD" not in res.output
    assert not (tmp_path / "k.png").exists()


def test_plot_png(ckpts, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "kld.png"
    res = CliRunner().invoke(main, ["eval", "accuracy", str(ckpts["noisy"]), str(ckpts["noisier"]),
                                    "--reference", str(ckpts["src"]), *FAST, "--plot", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_user_errors(ckpts, tmp_path):
    run = CliRunner().invoke
    other = synth("qwen3-moe", tmp_path / "moe")
    res = run(main, ["eval", "accuracy", str(other), "--reference", str(ckpts["src"]), *FAST])
    assert res.exit_code == 1 and "not the reference's model" in res.output
    res = run(main, ["eval", "accuracy", str(ckpts["noisy"]), "--reference", str(ckpts["src"]), *FAST, "--data", str(tmp_path / "nope.txt")])
    assert res.exit_code == 1 and "no such file" in res.output
    res = run(main, ["eval", "accuracy", str(ckpts["noisy"]), "--reference", str(ckpts["src"]), "--tokens", "100000", "--no-progress"])
    assert res.exit_code == 1 and "fewer than --tokens" in res.output
    res = run(main, ["eval", "accuracy", str(ckpts["noisy"]), "--reference", str(ckpts["src"]), *FAST, "--min-top1", "101"])
    assert res.exit_code == 2  # usage error: top-1 is a percentage


def test_reference_refuses_an_incomplete_checkpoint(ckpts, tmp_path):
    """transformers would random-init a missing weight; the reference runner must refuse instead."""
    bad = tmp_path / "bad"
    shutil.copytree(ckpts["src"], bad)
    index = json.loads((bad / "model.safetensors.index.json").read_text())
    name = "model.layers.0.mlp.up_proj.weight"
    f = bad / index["weight_map"].pop(name)
    t = load_file(f)
    del t[name]
    save_file(t, f, metadata={"format": "pt"})
    (bad / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"did not load the checkpoint cleanly \(missing: " + name.replace(".", r"\.")):
        TransformersRunner(bad)
