"""Safety cases that need more than one command: the HF cache layout, a full disk, resume against changed
source bytes, an FP8 MTP eh_proj, and a killed --workers convert (rules: docs/safety.md)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantkit import destination, writer
from quantkit.writer import CheckpointWriter
from quantkit.converters import ConvertOptions, convert, make_plan
from quantkit.converters.engine import execute
from quantkit.converters.provenance import FILE_HASH, SourceHashes
from quantkit.synth import synthesize

from ..converters.support import shard_bytes
from .support import INDEX, OUTSIDE, cli, error_line, side_symlink_outside


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
    """Shard files written by quantkit.writer see a disk that is full after ``nbytes``."""
    budget = [nbytes]

    def fake_open(path, mode="r", *a, **k):
        f = open(path, mode, *a, **k)
        return _FullDisk(f, budget) if str(path).endswith(".part") else f

    monkeypatch.setattr(writer, "open", fake_open, raising=False)


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
                m.setattr(writer.CheckpointWriter, "_save_progress", full)
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
    w = CheckpointWriter(tmp_path / "o", job=plan.job(), sources=SourceHashes(plan), file_hash=FILE_HASH)
    execute(plan, w, lambda n: None)  # every shard written, then killed before the commit
    w.close()
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
    assert sources["file_hash"] == "sha256-tree-64MiB"
    leaf = hashlib.sha256(changed.read_bytes()).digest()  # the file is under 64 MiB: one leaf
    assert sources["files"][changed.name] == hashlib.sha256(leaf + (64 << 20).to_bytes(8, "little")).hexdigest()


@pytest.mark.parametrize("recorded", [None, "sha256"])
def test_resume_redoes_shards_whose_source_digests_are_in_another_scheme(base: Path, tmp_path: Path, recorded) -> None:
    """A partial run that recorded plain sha256 digests (None: written before schemes were named) cannot be
    compared with today's: every shard is redone, and reported so, not kept and not called a changed source."""
    opts = dict(to="fp8-block", max_shard_size=1_000_000)
    plan = make_plan(str(base), ConvertOptions(**opts))
    w = CheckpointWriter(tmp_path / "o", job=plan.job(), sources=SourceHashes(plan), file_hash=FILE_HASH)
    execute(plan, w, lambda n: None)  # every shard written, then killed before the commit
    w.close()
    prog = w.tmp / "progress.json"
    state = json.loads(prog.read_text())
    plain = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in base.glob("*.safetensors")}
    state["made_from"] = {f: {n: plain[n] for n in made} for f, made in state["made_from"].items()}
    state.pop("file_hash")
    if recorded:
        state["file_hash"] = recorded
    prog.write_text(json.dumps(state))
    rep = convert(base, tmp_path / "o", ConvertOptions(resume=True, **opts))
    r = rep["run"]
    assert r["shards_redone_other_hash_scheme"] == [sh.file for sh in plan.shards] and len(plan.shards) > 1
    assert r["shards_resumed"] == 0 and r["shards_redone_source_changed"] == []
    convert(base, tmp_path / "ref", ConvertOptions(**opts))
    assert shard_bytes(tmp_path / "o") == shard_bytes(tmp_path / "ref")
    assert json.loads((tmp_path / "o" / "quantkit.json").read_text())["source"]["file_hash"] == FILE_HASH


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
