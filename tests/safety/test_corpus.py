"""Checkpoints that cannot fool us: a table-driven corpus of bad inputs and hostile destinations.

Each case copies a tiny synthesized checkpoint (Qwen3-MoE, DeepSeek-V3 or GPT-OSS), corrupts the copy (or the place DST
names), runs a command through the CLI and checks: the exit code, the one-line error (or the
outcome), that the source's bytes are unchanged, and what is left beside DST (no partial, old or
lock sibling unless the rule says so).  The rules are docs/safety.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from quantkit import destination

from ..converters.support import dir_digest
from .support import INDEX, OUTSIDE, cli, error_line, side_symlink_outside

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
