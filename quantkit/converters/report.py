"""The report of a conversion (what ``--json`` prints) and its markdown rendering for people."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..checkpoint import itemsize
from .items import MODULE
from .plan import Plan

if TYPE_CHECKING:
    from .engine import ShardResult

GB = 1e9


def _source_bytes(plan: Plan) -> int:
    total = 0
    for loc in plan.locs.values():
        n = 1
        for s in loc.shape:
            n *= s
        total += n * itemsize(loc.dtype)
    return total


def _base(plan: Plan, dst: str) -> dict:
    return {
        "source": {"path": plan.src, "family": plan.family, "layout": plan.layout, "fingerprint": plan.fingerprint,
                   "tensors": len(plan.locs), "bytes": _source_bytes(plan)},
        "destination": dst,
        "options": plan.recorded_options(),
        "side_files_skipped": plan.skipped_side,
        "output": {"shards": len(plan.shards), "tensors": sum(len(s.specs) for s in plan.shards),
                   "bytes": sum(s.nbytes for s in plan.shards)},
    }


def _paths(plan: Plan, fidelity: dict[str, dict] | None) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for t in plan.tasks:
        rec = fidelity[t.item.name] if fidelity else None
        path = rec["path"] if rec else t.path
        row = rows.setdefault(path, {"tensors": 0, "bytes": 0})
        row["tensors"] += 1
        row["bytes"] += sum(s.nbytes for s in t.outputs)
        if rec:
            row["exact_path"] = rec["exact_path"]
            row["max_rel_err"] = max(row.get("max_rel_err", 0.0), _f(rec["rel_err"]))
            row["min_exact_share"] = min(row.get("min_exact_share", 1.0), _f(rec["exact_share"]))
    return rows


def _f(x: float | str) -> float:
    return float(x)


def dry_report(plan: Plan, dst: str) -> dict:
    rep = _base(plan, dst)
    rep["dry_run"] = True
    rep["paths"] = _paths(plan, None)
    rep["shards"] = [{"file": s.file, "tensors": len(s.specs), "bytes": s.nbytes} for s in plan.shards]
    return rep


def run_report(plan: Plan, dst: str, fidelity: dict[str, dict], results: list["ShardResult"], kept: int, seconds: float, main_peak: int) -> dict:
    rep = _base(plan, dst)
    o = plan.options
    backends = {op: b for r in results for op, b in r.backends.items()}
    rep["run"] = {"device": o.device, "workers": o.workers, "seconds": round(seconds, 3),
                  "shards_written": len(results), "shards_resumed": kept,
                  "backends": backends or {"*": "torch (formats/ reference)"}}
    rep["throughput"] = {"source_gbps": round(rep["source"]["bytes"] / GB / seconds, 4),
                         "output_gbps": round(rep["output"]["bytes"] / GB / seconds, 4)}
    rep["memory"] = {"main_peak_rss_anon": main_peak,
                     "shards": [{"file": r.file, "rss_anon_base": r.rss_base, "rss_anon_peak": r.rss_peak} for r in results]}
    rep["paths"] = _paths(plan, fidelity)
    rep["dequantized_modules"] = [t.item.name for t in plan.tasks if t.path == "dequantize" and t.item.role == MODULE]
    # plain copies (norms, embeddings kept as they are) never round: the note is for quantized tensors taken exactly
    exact = sorted({r["path"] for r in fidelity.values() if r["exact_path"] and r["path"] != "copy"})
    if o.rounding == "stochastic" and exact:
        rep["note"] = f"exact paths ({', '.join(exact)}) round nothing: --rounding does not apply to them"
    rep["tensors"] = fidelity
    return rep


def _gb(n: int) -> str:
    return f"{n / GB:.3f} GB"


def render(rep: dict) -> str:
    s, out = rep["source"], rep["output"]
    lines = [f"# quantkit convert: {s['family']} ({s['layout']} layout) -> {rep['options']['to']}", "",
             f"source  {s['path']}  {s['tensors']} tensors, {_gb(s['bytes'])}",
             f"output  {rep['destination']}  {out['tensors']} tensors, {_gb(out['bytes'])} in {out['shards']} shard(s)"]
    if "run" in rep:
        r, t = rep["run"], rep["throughput"]
        peak = max([m["rss_anon_peak"] - m["rss_anon_base"] for m in rep["memory"]["shards"]] or [0])
        lines.append(f"run     {r['seconds']} s on {r['device']} x{r['workers']}: source {t['source_gbps']} GB/s, "
                     f"output {t['output_gbps']} GB/s, peak RssAnon growth per shard {peak / 2**20:.1f} MiB"
                     + (f", {r['shards_resumed']} shard(s) kept from the interrupted run" if r["shards_resumed"] else "")
                     + (f", {len(r['shards_redone_source_changed'])} redone (a source file they read changed)"
                        if r.get("shards_redone_source_changed") else "")
                     + (f", {len(r['shards_redone_other_hash_scheme'])} redone (their source digests were in another scheme)"
                        if r.get("shards_redone_other_hash_scheme") else ""))
    lines += ["", "| path | tensors | output bytes | exact path | max rel. error | min share exact |", "|---|---|---|---|---|---|"]
    for path, row in sorted(rep["paths"].items()):
        ex = {True: "yes", False: "no"}.get(row.get("exact_path"), "planned")
        err = f"{row['max_rel_err']:.3g}" if "max_rel_err" in row else "-"
        share = f"{row['min_exact_share']:.4f}" if "min_exact_share" in row else "-"
        lines.append(f"| {path} | {row['tensors']} | {_gb(row['bytes'])} | {ex} | {err} | {share} |")
    if rep.get("note"):
        lines += ["", rep["note"]]
    lines += [f"dequantized to BF16 (stored FP8, kept in source precision by the family's rule): {n}" for n in rep.get("dequantized_modules", [])]
    lines += [f"side file skipped (outside the checkpoint): {s}" for s in rep.get("side_files_skipped", [])]
    if rep.get("dry_run"):
        lines += ["", "dry run: nothing written"]
    return "\n".join(lines)
