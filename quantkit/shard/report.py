"""Text rendering of the ``quantkit shard`` report (the JSON form is the report dict itself)."""

from __future__ import annotations


def _gb(n: int) -> str:
    return f"{n / 1e9:.3f} GB"


def render(rep: dict) -> str:
    head = "plan (dry run, nothing written)" if rep["dry_run"] else "sharded"
    lines = [
        f"{head}: {rep['src']} -> {rep['dst']}",
        f"  family {rep['family']}; {rep['world_size']} ranks: ep {rep['ep']} = dp {rep['dp']} x tp {rep['tp']}",
        f"  experts: {rep['n_routed_experts']} routed x {rep['moe_layers']} MoE layers, placement {rep['placement']}",
        f"  source {_gb(rep['source_bytes'])}; written once {_gb(rep['bytes_written'])}; "
        f"held by all ranks {_gb(rep['bytes_held'])} (largest rank {_gb(rep['max_rank_bytes'])})",
    ]
    for key, g in rep["groups"].items():
        if g["ranks"] > 1:
            lines.append(f"  {key}: {g['tensors']} tensors, {_gb(g['bytes'])}, shared by {g['ranks']} ranks")
    if rep["load"]:
        ld = rep["load"]
        lines.append(
            f"  expert load max/mean per rank: worst layer {ld['max_over_mean_worst_layer']:.3f}, "
            f"layer average {ld['max_over_mean_avg_layer']:.3f}, all layers summed {ld['max_over_mean_all_layers']:.3f}"
        )
    lines += [f"  side file skipped (outside the checkpoint): {s}" for s in rep.get("side_files_skipped", [])]
    if not rep["dry_run"]:
        lines.append(f"  {rep['seconds']:.2f} s, {rep['gb_per_s']} GB/s written")
        v = rep.get("verify")
        if v:
            lines.append(f"  verified in {v['seconds']:.2f} s: {v['tensors']} tensors reassembled byte for byte from {v['ranks']} ranks, "
                         f"{v['files_hashed']} files hashed")
    return "\n".join(lines)
