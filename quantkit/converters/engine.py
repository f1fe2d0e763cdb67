"""Streaming execution of a plan: shard by shard, in this process or in a pool of worker processes.

A shard is the unit of work and of resumption: a worker streams its tensors, in plan order, into
``<shard>.part`` (writer.write_shard), renames it, writes the shard's fidelity records to
``.fidelity/<shard>.json`` in the partial directory, and only then does the main process record the
shard's sha256 in progress.json.  Which tensors a shard holds is fixed by the plan, never by the
worker count, so the bytes are the same whatever ``--workers``.  A task whose weight and scale fall
into two shards is computed by both (each writes its own part; the weight's shard reports fidelity).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.managers import SyncManager
from pathlib import Path

import torch

from ..checkpoint import DTYPES, CheckpointError
from ..writer import CheckpointWriter, write_shard
from .memory import RssSampler
from .ops import Ops
from .plan import Plan
from .source import Reader
from .targets import COPY_PATHS, Context, run_task

FIDELITY_DIR = ".fidelity"


@dataclass
class ShardResult:
    file: str
    digest: str
    seconds: float
    rss_base: int
    rss_peak: int
    backends: dict[str, str]  # op -> backend that ran it (empty on CPU: the formats/ reference)


def _context(plan: Plan, ops: Ops, tick: Callable[[], None]) -> Context:
    o = plan.options
    return Context(ops, o.base_rounding(), plan.scale_fmt, o.rule, o.chunk, tick)


def shard_tensors(plan: Plan, index: int, reader: Reader, ctx: Context, fidelity: dict, progress: Callable[[int], None]) -> Iterator[torch.Tensor]:
    names = {s.name for s in plan.shards[index].specs}
    for ti in plan.shard_tasks(index):
        task = plan.tasks[ti]
        owner = task.outputs[0].name in names
        tensors, record = run_task(task, reader, ctx, want=owner)
        if record is not None:
            fidelity[task.item.name] = record
        for spec in task.outputs:
            if spec.name in names:
                progress(spec.nbytes)
                yield tensors.pop(spec.name)
        del tensors


def source_views(plan: Plan, index: int) -> set[str]:
    """Outputs of shard ``index`` that are views of the mapped source: a copy's weight, where the
    source offset is aligned (else Reader.view copies it).  Page cache, not process memory."""
    views = set()
    for ti in plan.shard_tasks(index):
        task = plan.tasks[ti]
        loc = plan.locs[task.item.source.tensors[0]]
        if task.path in COPY_PATHS and loc.offset % DTYPES[loc.dtype].itemsize == 0:
            views.add(task.outputs[0].name)
    return views


def convert_shard(plan: Plan, index: int, tmp: str, progress: Callable[[int], None] | None = None) -> ShardResult:
    """Write shard ``index`` of ``plan`` into the partial directory ``tmp``; return its digest."""
    t0 = time.perf_counter()
    shard = plan.shards[index]
    with RssSampler() as rss:
        reader = Reader(plan.locs)
        ops = Ops(plan.options.device)
        ctx = _context(plan, ops, rss.sample)
        fidelity: dict[str, dict] = {}
        tensors = shard_tensors(plan, index, reader, ctx, fidelity, progress or (lambda n: None))
        digest = write_shard(Path(tmp) / shard.file, shard, tensors, borrowed=source_views(plan, index))
        save_fidelity(Path(tmp), shard.file, fidelity)
        reader.close()
    return ShardResult(shard.file, digest, time.perf_counter() - t0, rss.base, rss.peak, ops.backends())


def save_fidelity(tmp: Path, file: str, records: dict) -> None:
    d = tmp / FIDELITY_DIR
    d.mkdir(exist_ok=True)
    part = d / (file + ".json.part")
    part.write_text(json.dumps(records))
    os.replace(part, d / (file + ".json"))


def load_fidelity(plan: Plan, tmp: Path) -> dict[str, dict]:
    """Fidelity records of every shard, in plan order."""
    found: dict[str, dict] = {}
    for shard in plan.shards:
        p = tmp / FIDELITY_DIR / (shard.file + ".json")
        if not p.exists():
            raise CheckpointError(f"{tmp}: shard {shard.file} has no fidelity record; run without --resume to start over")
        found.update(json.loads(p.read_text()))
    return {t.item.name: found[t.item.name] for t in plan.tasks}


def watch_parent(parent: int) -> None:
    """Exit this process once ``parent`` is gone: a worker or the progress manager of a convert that was
    killed (SIGKILL runs no cleanup) must not live on, holding the resource tracker open with it."""

    def run() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=run, name="watch-parent", daemon=True).start()


def _init_worker(threads: int, parent: int) -> None:
    watch_parent(parent)
    torch.set_num_threads(threads)


def run_pool(plan: Plan, todo: list[int], writer: CheckpointWriter, progress: Callable[[int], None]) -> list[ShardResult]:
    ctx = get_context("spawn")
    n = min(plan.options.workers, len(todo))
    threads = max(1, (os.cpu_count() or 1) // n)
    results: list[ShardResult] = []
    manager = SyncManager(ctx=ctx)
    manager.start(watch_parent, (os.getpid(),))
    with manager, ProcessPoolExecutor(n, mp_context=ctx, initializer=_init_worker, initargs=(threads, os.getpid())) as pool:
        queue = manager.Queue()
        pending = {pool.submit(convert_shard, plan, i, str(writer.tmp), queue.put) for i in todo}
        try:
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                while not queue.empty():
                    progress(queue.get())
                for f in done:
                    r = f.result()
                    writer.record(r.file, r.digest)
                    results.append(r)
        except BaseException:
            for f in pending:
                f.cancel()
            raise
    return results


def execute(plan: Plan, writer: CheckpointWriter, progress: Callable[[int], None]) -> list[ShardResult]:
    """Convert every shard not already done (resume); record each as it completes."""
    todo = [i for i, s in enumerate(plan.shards) if not writer.is_done(s.file)]
    if plan.options.workers > 1 and len(todo) > 1:
        return run_pool(plan, todo, writer, progress)
    results = []
    for i in todo:
        r = convert_shard(plan, i, str(writer.tmp), progress)
        writer.record(r.file, r.digest)
        results.append(r)
    return results
