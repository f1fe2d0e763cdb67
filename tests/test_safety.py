"""Checkpoints that cannot fool us: a table-driven corpus of bad inputs and hostile destinations.

Each case copies one tiny synthesized Qwen3-MoE checkpoint, corrupts the copy (or the place DST
names), runs a command through the CLI and checks: the exit code, the one-line error (or the
outcome), that the source's bytes are unchanged, and what is left beside DST (no partial, old or
lock sibling unless the rule says so).  The rules are docs/safety.md.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from quantkit import checkpoint, destination
from quantkit.checkpoint import CheckpointWriter
from quantkit.cli import main
from quantkit.converters import ConvertOptions, convert, make_plan
from quantkit.converters.engine import execute
from quantkit.converters.provenance import SourceHashes
from quantkit.synth import synthesize

from .converters.support import dir_digest, shard_bytes

INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """family -> a tiny synth of it (made once), with a README.md side file."""
    root = tmp_path_factory.mktemp("safety")

    def get(family: str) -> Path:
        src = root / family
        if not src.exists():
            synthesize(family, src, preset="tiny", max_shard_size="300KB")
            (src / "README.md").write_text("the model card\n")
        return src

    return get


@pytest.fixture
def base(bases) -> Path:
    return bases("qwen3-moe")


def cli(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


def error_line(r) -> str:
    """The command's error: exactly one line, starting with "Error:"."""
    lines = [ln for ln in r.output.strip().splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1, r.output
    assert "Traceback" not in r.output, r.output
    return lines[0]


# ---------------------------------------------------------------- corruptions of the source


def _outside_file(src: Path) -> Path:
    """A valid weight file outside the checkpoint (a copy of its first shard)."""
    first = sorted(src.glob("*.safetensors"))[0]
    out = src.parent / "elsewhere" / first.name
    out.parent.mkdir(exist_ok=True)
    shutil.copy(first, out)
    return out


def map_relative_outside(src: Path) -> None:
    out = _outside_file(src)
    idx = json.loads((src / INDEX).read_text())
    idx["weight_map"] = {k: (f"../elsewhere/{v}" if v == out.name else v) for k, v in idx["weight_map"].items()}
    (src / INDEX).write_text(json.dumps(idx))


def map_absolute_outside(src: Path) -> None:
    out = _outside_file(src)
    idx = json.loads((src / INDEX).read_text())
    idx["weight_map"] = {k: (str(out) if v == out.name else v) for k, v in idx["weight_map"].items()}
    (src / INDEX).write_text(json.dumps(idx))


def weight_symlink_outside(src: Path) -> None:
    out = _outside_file(src)
    (src / out.name).unlink()
    (src / out.name).symlink_to(out)


def config_symlink_outside(src: Path) -> None:
    out = src.parent / "elsewhere" / "config.json"
    out.parent.mkdir(exist_ok=True)
    shutil.move(src / "config.json", out)
    (src / "config.json").symlink_to(out)


def side_symlink_outside(src: Path) -> None:
    secret = src.parent / "id_rsa"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (src / "README.md").unlink()
    (src / "README.md").symlink_to(secret)


def nothing(p: Path) -> None:
    return None


def poke(src: Path, name: str, values: dict[int, bytes]) -> None:
    """Overwrite elements (flat index -> raw bytes) of tensor ``name`` in place: the header stays as it was."""
    idx = src / INDEX
    fname = json.loads(idx.read_text())["weight_map"][name] if idx.exists() else "model.safetensors"
    path = src / fname
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    e = json.loads(raw[8 : 8 + n])[name]
    size = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "U8": 1}[e["dtype"]]
    with open(path, "r+b") as f:
        for i, b in values.items():
            assert len(b) == size
            f.seek(8 + n + e["data_offsets"][0] + i * size)
            f.write(b)


BF16_NAN, BF16_INF = b"\xc0\x7f", b"\x80\x7f"
F32_NAN, F32_INF, F32_ZERO, F32_NEG = (struct.pack("<f", v) for v in (float("nan"), float("inf"), 0.0, -1.0))
QW = "model.layers.0.mlp.experts.1.up_proj.weight"
DS = "model.layers.0.self_attn.q_b_proj.weight"  # tiny: [N, 128] F8_E4M3, scale grid [ceil(N/128), 1]
GO = "model.layers.0.mlp.experts.gate_up_proj_scales"


def nan_bf16(src: Path) -> None:
    poke(src, QW, {i: BF16_NAN for i in (70, 71, 300, 301, 302)})


def inf_norm(src: Path) -> None:
    poke(src, "model.norm.weight", {3: BF16_INF})


def e4m3_nan(src: Path) -> None:
    poke(src, DS, {129: b"\x7f", 4000: b"\xff"})


def scale_nan(src: Path) -> None:
    poke(src, DS + "_scale_inv", {1: F32_NAN})


def scale_inf(src: Path) -> None:
    poke(src, DS + "_scale_inv", {0: F32_INF})


def scale_negative(src: Path) -> None:
    poke(src, DS + "_scale_inv", {0: F32_NEG})


def scale_zero(src: Path) -> None:
    poke(src, DS + "_scale_inv", {0: F32_ZERO})


def scale_zero_on_zero_tile(src: Path) -> None:
    poke(src, DS + "_scale_inv", {0: F32_ZERO})
    k = json.loads((src / "config.json").read_text())["q_lora_rank"]  # q_b_proj is [N, q_lora]
    poke(src, DS, {r * k + c: b"\x00" for r in range(128) for c in range(min(k, 128))})


def e8m0_nan(src: Path) -> None:
    poke(src, GO, {5: b"\xff"})


def e8m0_smallest(src: Path) -> None:
    poke(src, GO, {5: b"\x00"})


# ---------------------------------------------------------------- what DST names before the run


def dst_file(dst: Path) -> None:
    dst.write_text("my notes\n")


def dst_link_to_dir(dst: Path) -> None:
    target = dst.parent / "target"
    target.mkdir()
    (target / "mine.txt").write_text("keep me\n")
    dst.symlink_to(target)


def dst_dangling_link(dst: Path) -> None:
    dst.symlink_to(dst.parent / "nowhere")


def dst_leftover_old(dst: Path) -> None:
    dst.mkdir()
    (dst.parent / ".dst.quantkit-old").mkdir()
    (dst.parent / ".dst.quantkit-old" / "x").write_text("x")


def dst_locked(dst: Path) -> destination.Lock:
    return destination.Lock(destination.named(dst), "convert (another run)")


def dst_stale_lock(dst: Path) -> None:
    (dst.parent / ".dst.quantkit-lock").write_text(json.dumps({"pid": 999999, "host": "h", "command": "shard", "since": "then"}))


@dataclass
class Case:
    name: str
    corrupt: Callable[[Path], None]  # the source copy
    args: tuple[str, ...]  # the command, then options after SRC DST
    error: str | None  # a regex of the one error line; None: the command succeeds
    check: Callable[[Path, Path, object], None] | None = None  # (src, dst, result) -> asserts
    place: Callable[[Path], object] = nothing  # what DST names before the run
    family: str = "qwen3-moe"
    problem: str | None = None  # inspect: a regex of the problem line it must list


def _no_readme(src: Path, dst: Path, r) -> None:
    assert "id_rsa" in r.output or "README.md" in r.output, r.output
    for p in dst.rglob("README.md"):
        assert "PRIVATE KEY" not in p.read_text(), p
    assert not list(dst.rglob("README.md"))


def _target_kept(src: Path, dst: Path, r) -> None:
    target = dst.parent / "target"
    assert sorted(p.name for p in target.iterdir()) == ["mine.txt"], "wrote through the DST link"


CONVERT = ("convert", "--to", "fp8-block")
SHARD = ("shard", "--ep", "2")
OUTSIDE = r"refused weight file: (its name leaves|it resolves to .*, outside) the checkpoint directory"
CASES = [
    Case("index entry ../ outside, convert", map_relative_outside, CONVERT, OUTSIDE),
    Case("index entry ../ outside, shard", map_relative_outside, SHARD, OUTSIDE),
    Case("index entry ../ outside, inspect", map_relative_outside, ("inspect",), OUTSIDE),
    Case("index entry absolute path, convert", map_absolute_outside, CONVERT, OUTSIDE),
    Case("index entry absolute path, shard", map_absolute_outside, SHARD, OUTSIDE),
    Case("weight file symlinked outside, convert", weight_symlink_outside, CONVERT, OUTSIDE),
    Case("config.json symlinked outside, convert", config_symlink_outside, CONVERT, r"refused config file: it resolves to"),
    Case("side file symlinked outside, convert", side_symlink_outside, CONVERT, None, _no_readme),
    Case("side file symlinked outside, shard", side_symlink_outside, SHARD, None, _no_readme),
    Case("DST a file, convert", nothing, CONVERT, r"dst already exists: pass --force .*\(it is a file\)", place=dst_file),
    Case("DST a file, shard", nothing, SHARD, r"dst already exists: pass --force .*\(it is a file\)", place=dst_file),
    Case("DST a file, convert --force", nothing, (*CONVERT, "--force"), None, place=dst_file),
    Case("DST a link to a dir, shard", nothing, SHARD, r"already exists: pass --force .*\(it is a symlink\)", place=dst_link_to_dir),
    Case("DST a link to a dir, convert --force", nothing, (*CONVERT, "--force"), None, _target_kept, place=dst_link_to_dir),
    Case("DST a link to a dir, shard --force", nothing, (*SHARD, "--force"), None, _target_kept, place=dst_link_to_dir),
    Case("DST a dangling link, convert", nothing, CONVERT, r"\(it is a dangling symlink\)", place=dst_dangling_link),
    Case("DST a dangling link, convert --force", nothing, (*CONVERT, "--force"), None, place=dst_dangling_link),
    Case("DST a dangling link, shard --force", nothing, (*SHARD, "--force"), None, place=dst_dangling_link),
    Case("a .quantkit-old left by a killed run, convert --force", nothing, (*CONVERT, "--force"), None, place=dst_leftover_old),
    Case("DST locked by another run, convert", nothing, CONVERT, r"another run is writing it: pid \d+ .*convert \(another run\)", place=dst_locked),
    Case("DST locked by another run, shard", nothing, SHARD, r"another run is writing it: pid \d+", place=dst_locked),
    Case("a stale lock of a dead run, shard", nothing, SHARD, None, place=dst_stale_lock),
    Case("BF16 NaN, convert", nan_bf16, CONVERT, QW + r": 5 NaN/Inf values, the first at \[0, 70\]: convert refuses non-finite"),
    Case("BF16 NaN, convert --to bf16", nan_bf16, ("convert", "--to", "bf16"), QW + r": 5 NaN/Inf values"),
    Case("BF16 NaN, inspect", nan_bf16, ("inspect",), None, problem=QW + r": 5 NaN/Inf values, the first at \[0, 70\]"),
    Case("BF16 Inf in a copied norm, convert", inf_norm, CONVERT, r"model.norm.weight: 1 NaN/Inf values, the first at \[3\]"),
    Case("E4M3 NaN bytes, convert", e4m3_nan, CONVERT, DS + r": 2 E4M3 NaN bytes, the first at \[1, 1\]", family="deepseek-v3"),
    Case("E4M3 NaN bytes, convert mxfp8", e4m3_nan, ("convert", "--to", "mxfp8"), DS + r": 2 E4M3 NaN bytes", family="deepseek-v3"),
    Case("E4M3 NaN bytes, inspect", e4m3_nan, ("inspect",), None, family="deepseek-v3", problem=DS + r": 2 E4M3 NaN bytes"),
    Case("FP8 block scale NaN, convert", scale_nan, CONVERT, DS + r"_scale_inv: 1 NaN/Inf values, the first at \[1, 0\]", family="deepseek-v3"),
    Case("FP8 block scale Inf, convert bf16", scale_inf, ("convert", "--to", "bf16"), DS + r"_scale_inv: 1 NaN/Inf", family="deepseek-v3"),
    Case("FP8 block scale Inf, inspect", scale_inf, ("inspect",), None, family="deepseek-v3", problem=DS + r"_scale_inv: 1 NaN/Inf values"),
    Case("FP8 block scale negative, inspect", scale_negative, ("inspect",), None, family="deepseek-v3",
         problem=DS + r"_scale_inv: 1 negative block scales, the first at \[0, 0\]"),
    Case("FP8 block scale zero on a non-zero tile, inspect", scale_zero, ("inspect",), None, family="deepseek-v3",
         problem=DS + r"_scale_inv: 1 zero block scales on tiles that are not all zero"),
    Case("FP8 block scale zero on an all-zero tile, inspect", scale_zero_on_zero_tile, ("inspect",), None, family="deepseek-v3"),
    Case("E8M0 NaN scale byte, convert", e8m0_nan, CONVERT, GO + r": 1 E8M0 NaN scale bytes \(0xFF\), the first at \[0, 0, 5\]", family="gpt-oss"),
    Case("E8M0 NaN scale byte, inspect", e8m0_nan, ("inspect",), None, family="gpt-oss", problem=GO + r": 1 E8M0 NaN scale bytes"),
    Case("E8M0 0x00 (2^-127) is a scale, convert", e8m0_smallest, ("convert", "--to", "mxfp8"), None, family="gpt-oss"),
    Case("E8M0 0x00 (2^-127) is a scale, inspect", e8m0_smallest, ("inspect",), None, family="gpt-oss"),
]


def state(p: Path) -> tuple:
    """What is at ``p``, to prove a refused run left it alone."""
    if p.is_symlink():
        return ("link", os.readlink(p), state(p.resolve()) if p.exists() else None)
    if p.is_dir():
        return ("dir", dir_digest(p))
    return ("file", p.read_bytes()) if p.exists() else ("none",)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corpus(case: Case, bases, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(bases(case.family), src, symlinks=True)
    case.corrupt(src)
    before = dir_digest(src)
    dst = tmp_path / "dst"
    held = case.place(dst)
    was = state(dst)
    cmd, *opts = case.args
    r = cli(cmd, src, *opts) if cmd == "inspect" else cli(cmd, src, dst, *opts)
    if held is not None:
        held.release()
    if cmd == "inspect" and case.error is None:
        assert r.exit_code == (1 if case.problem else 0), r.output
        assert not case.problem or re.search("^- " + case.problem, r.output, re.M), r.output
    elif case.error is None:
        assert r.exit_code == 0, r.output
        assert dst.is_dir() and not dst.is_symlink()
    else:
        assert r.exit_code != 0
        assert re.search(case.error, error_line(r)), r.output
        assert state(dst) == was, "a refused run changed DST"
    if case.check is not None:
        case.check(src, dst, r)
    assert dir_digest(src) == before, "the source changed"
    left = {p.name for p in tmp_path.iterdir()} - {"src", "elsewhere", "id_rsa", "dst", "target", "nowhere"}
    assert not left, f"left beside DST: {left}"


# ---------------------------------------------------------------- cases that need more than one command


def hf_cache(src: Path, root: Path) -> Path:
    """``src`` laid out as a Hugging Face cache repository: snapshot symlinks into blobs/; returns the snapshot."""
    repo = root / "models--org--tiny"
    snap = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, p in enumerate(sorted(src.iterdir())):
        blob = repo / "blobs" / f"blob{i:04d}"
        shutil.copy(p, blob)
        (snap / p.name).symlink_to(Path("../../blobs") / blob.name)
    return snap


def test_hugging_face_cache_layout_is_read(base: Path, tmp_path: Path) -> None:
    snap = hf_cache(base, tmp_path / "hub")
    r = cli("convert", snap, tmp_path / "o", "--to", "fp8-block", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["side_files_skipped"] == []
    assert (tmp_path / "o" / "README.md").read_text() == "the model card\n"
    assert not (tmp_path / "o" / "README.md").is_symlink()
    r = cli("shard", snap, tmp_path / "s", "--ep", "2")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "s" / "rank-00001-of-00002" / "README.md").read_text() == "the model card\n"
    assert cli("inspect", snap).exit_code == 0


def test_hf_cache_link_into_another_repository_is_refused(base: Path, tmp_path: Path) -> None:
    snap = hf_cache(base, tmp_path / "hub")
    other = hf_cache(base, tmp_path / "hub2")
    first = sorted(snap.glob("*.safetensors"))[0]
    first.unlink()
    first.symlink_to(other / first.name)
    r = cli("convert", snap, tmp_path / "o", "--to", "fp8-block")
    assert r.exit_code == 1 and re.search(OUTSIDE, error_line(r))


class _FullDisk:
    """A file whose writes fail with ENOSPC once ``budget[0]`` bytes have been written through any of them."""

    def __init__(self, f, budget: list[int]) -> None:
        self.f, self.budget = f, budget

    def write(self, b) -> int:
        n = memoryview(b).nbytes
        if n > self.budget[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.budget[0] -= n
        return self.f.write(b)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


def fill_disk_after(monkeypatch: pytest.MonkeyPatch, nbytes: int) -> None:
    """Shard files written by quantkit.checkpoint see a disk that is full after ``nbytes``."""
    budget = [nbytes]

    def fake_open(path, mode="r", *a, **k):
        f = open(path, mode, *a, **k)
        return _FullDisk(f, budget) if str(path).endswith(".part") else f

    monkeypatch.setattr(checkpoint, "open", fake_open, raising=False)


DISK_FULL = r"no space left on device: [\d,]+ bytes still to write, [\d,]+ free"


def test_disk_full_keeps_the_partial_output_for_resume(base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dst, partial = tmp_path / "o", tmp_path / ".o.quantkit-partial"
    args = ("convert", base, dst, "--to", "fp8-block", "--max-shard-size", "1MB")
    with monkeypatch.context() as m:
        fill_disk_after(m, 2_500_000)
        r = cli(*args)
    line = error_line(r)
    assert r.exit_code == 1 and re.search(DISK_FULL, line) and "is kept" in line and "--resume" in line, line
    assert partial.is_dir() and not list(partial.rglob("*.part")), "a half-written .part was left"
    assert not dst.exists() and not (tmp_path / ".o.quantkit-lock").exists()
    done = json.loads((partial / "progress.json").read_text())["files"]
    assert done, "the shards written before the disk filled are kept"
    r = cli(*args, "--resume", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["run"]["shards_resumed"] == len(done)
    assert cli("convert", base, tmp_path / "ref", "--to", "fp8-block", "--max-shard-size", "1MB").exit_code == 0
    assert shard_bytes(dst) == shard_bytes(tmp_path / "ref")


def test_shard_on_a_full_disk_leaves_nothing(base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    for how in ("at the start", "while writing"):
        with monkeypatch.context() as m:
            if how == "at the start":
                m.setattr(checkpoint.CheckpointWriter, "_save_progress", full)
            else:
                fill_disk_after(m, 100_000)
            r = cli("shard", base, tmp_path / "o", "--ep", "2")
        line = error_line(r)
        assert r.exit_code == 1 and re.search(DISK_FULL, line) and "nothing was kept" in line, (how, line)
        assert not list(tmp_path.iterdir()), (how, list(tmp_path.iterdir()))


def test_resume_redoes_shards_whose_source_bytes_changed(base: Path, tmp_path: Path) -> None:
    """Same headers, other bytes (a fixed or re-downloaded shard): kept output shards must not mix them in."""
    other = tmp_path / "other"
    synthesize("qwen3-moe", other, preset="tiny", max_shard_size="300KB", seed=1)
    src = tmp_path / "src"
    shutil.copytree(base, src)
    opts = ConvertOptions(to="fp8-block", max_shard_size=1_000_000)
    plan = make_plan(str(src), opts)
    writer = CheckpointWriter(tmp_path / "o", job=plan.job(), sources=SourceHashes(plan))
    execute(plan, writer, lambda n: None)  # every shard written, then killed before the commit
    writer.close()
    changed = sorted(src.glob("*.safetensors"))[0]
    shutil.copy(other / changed.name, changed)  # the same header, other tensor bytes
    rep = convert(src, tmp_path / "o", ConvertOptions(to="fp8-block", max_shard_size=1_000_000, resume=True))
    redone = rep["run"]["shards_redone_source_changed"]
    readers = [sh.file for i, sh in enumerate(plan.shards) if changed.name in plan.shard_sources(i)]
    assert redone == readers and 0 < len(redone) < len(plan.shards)
    assert rep["run"]["shards_resumed"] == len(plan.shards) - len(redone)
    convert(src, tmp_path / "ref", ConvertOptions(to="fp8-block", max_shard_size=1_000_000))
    assert shard_bytes(tmp_path / "o") == shard_bytes(tmp_path / "ref")
    sources = json.loads((tmp_path / "o" / "quantkit.json").read_text())["source"]
    assert sources["file_hash"] == "sha256"
    assert sources["files"][changed.name] == hashlib.sha256(changed.read_bytes()).hexdigest()


def test_inspect_reports_a_side_file_outside(base: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(base, src)
    side_symlink_outside(src)
    r = cli("inspect", src)
    assert r.exit_code == 1 and re.search(r"- side file README.md: it resolves to .*id_rsa, outside the checkpoint", r.output), r.output


def test_deepseek_mtp_eh_proj_stored_fp8_is_dequantized(bases, tmp_path: Path) -> None:
    """Some DeepSeek-V3 files store MTP eh_proj as FP8 + weight_scale_inv: dequantized to BF16 by DeepSeek's
    rule (inference/kernel.py weight_dequant: each 128x128 tile times its scale), and reported."""
    src = tmp_path / "src"
    shutil.copytree(bases("deepseek-v3"), src)
    idx = json.loads((src / INDEX).read_text())
    name = next(n for n in idx["weight_map"] if n.endswith("eh_proj.weight"))
    shard = src / idx["weight_map"][name]
    ts = load_file(shard)
    g = torch.Generator().manual_seed(3)
    n, k = ts[name].shape
    q = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.rand(-(-n // 128), -(-k // 128), generator=g) + 0.01
    ts[name], ts[name + "_scale_inv"] = q, s
    save_file(ts, shard, metadata={"format": "pt"})
    idx["weight_map"][name + "_scale_inv"] = shard.name
    (src / INDEX).write_text(json.dumps(idx))
    for to in ("fp8-block", "mxfp8", "bf16"):
        r = cli("convert", src, tmp_path / to, "--to", to)
        assert r.exit_code == 0, r.output
        assert f"dequantized to BF16 (stored FP8, kept in source precision by the family's rule): {name}" in r.output
        out = {}
        for f in (tmp_path / to).glob("*.safetensors"):
            out.update(load_file(f))
        want = (q.float() * s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]).bfloat16()
        assert out[name].dtype == torch.bfloat16 and torch.equal(out[name], want)
        assert name + "_scale_inv" not in out


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_killed_convert_takes_its_worker_processes_with_it(tmp_path: Path) -> None:
    src = tmp_path / "src"
    synthesize("qwen3", src, preset="tiny", layers=8)
    dst, partial = tmp_path / "o", tmp_path / ".o.quantkit-partial"
    args = [sys.executable, "-m", "quantkit.cli", "convert", str(src), str(dst), "--to", "fp8-block", "--workers", "2",
            "--rounding", "stochastic", "--max-shard-size", "1MB"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline, kids = time.monotonic() + 120, set()
    while time.monotonic() < deadline and proc.poll() is None:
        kids = descendants(proc.pid)
        if len(kids) >= 4 and list(partial.glob("*.part")):  # resource tracker, manager, 2 workers, converting
            break
        time.sleep(0.05)
    assert proc.poll() is None and len(kids) >= 4, f"the workers never ran: {proc.stderr.read().decode()[-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(alive(k) for k in kids):
        time.sleep(0.1)
    assert not [k for k in kids if alive(k)], "processes outlived the killed convert"
    destination.Lock(destination.named(dst), "a later run").release()  # its lock died with it
