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
import re
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from quantkit import checkpoint, destination
from quantkit.checkpoint import CheckpointWriter
from quantkit.cli import main
from quantkit.converters import ConvertOptions, convert, make_plan
from quantkit.converters.engine import execute
from quantkit.converters.provenance import hash_files, shard_sources
from quantkit.synth import synthesize

from .converters.support import dir_digest, shard_bytes

INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("safety")
    synthesize("qwen3-moe", root / "src", preset="tiny", max_shard_size="300KB")
    (root / "src" / "README.md").write_text("the model card\n")
    return root / "src"


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
]


def state(p: Path) -> tuple:
    """What is at ``p``, to prove a refused run left it alone."""
    if p.is_symlink():
        return ("link", os.readlink(p), state(p.resolve()) if p.exists() else None)
    if p.is_dir():
        return ("dir", dir_digest(p))
    return ("file", p.read_bytes()) if p.exists() else ("none",)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corpus(case: Case, base: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(base, src, symlinks=True)
    case.corrupt(src)
    before = dir_digest(src)
    dst = tmp_path / "dst"
    held = case.place(dst)
    was = state(dst)
    cmd, *opts = case.args
    r = cli(cmd, src, *opts) if cmd == "inspect" else cli(cmd, src, dst, *opts)
    if held is not None:
        held.release()
    if case.error is None:
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
    writer = CheckpointWriter(tmp_path / "o", job=plan.job(), sources=shard_sources(plan, hash_files(plan.source_files)))
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
