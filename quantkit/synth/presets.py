"""Shapes of the synthetic checkpoints, per family and preset (data only).

``tiny``: a few MB; every weight dimension a multiple of 128, so transformers' CPU dequantizers
accept it (DeepSeek: kv_lora_rank 128 + qk_rope_head_dim 128 keeps kv_a_proj_with_mqa whole-tile).  ``tiny-ragged``: the real models'
ragged shapes in miniature (DeepSeek's 576-row kv_a_proj_with_mqa, GPT-OSS's 2880 = 22.5 x 128),
so partial 128-tiles are exercised; judged by DeepSeek's dequant rule, not transformers.  The
full-size presets carry the released models' shapes (REFERENCE.md; upstream config.json files)
and real vocabulary sizes; ``--layers`` cuts their depth.

``tok_base``: ids [0, tok_base) are BPE tokens; the family's special tokens follow (ids as in the
real tokenizer for full-size presets).  ``tok_reserved``: how many reserved / placeholder
specials the tokenizer carries.
"""

from __future__ import annotations

GPT_OSS: dict[str, dict] = {
    "tiny": dict(layers=2, hidden=256, intermediate=256, heads=4, kv_heads=2, head_dim=64, experts=8, top_k=4,
                 vocab=2048, tok_base=1984, sliding_window=32),
    "tiny-ragged": dict(layers=2, hidden=320, intermediate=192, heads=5, kv_heads=1, head_dim=64, experts=4, top_k=2,
                        vocab=2048, tok_base=1984, sliding_window=32),
    "gpt-oss-20b": dict(layers=24, hidden=2880, intermediate=2880, heads=64, kv_heads=8, head_dim=64, experts=32, top_k=4,
                        vocab=201088, tok_base=199998, sliding_window=128),
    "gpt-oss-120b": dict(layers=36, hidden=2880, intermediate=2880, heads=64, kv_heads=8, head_dim=64, experts=128, top_k=4,
                         vocab=201088, tok_base=199998, sliding_window=128),
}

DEEPSEEK_V3: dict[str, dict] = {
    "tiny": dict(layers=2, hidden=256, intermediate=512, moe_intermediate=128, heads=4, q_lora=128, kv_lora=128,
                 qk_nope=64, qk_rope=128, v_head=128, experts=8, shared=1, top_k=2, n_group=4, topk_group=2,
                 first_dense=1, vocab=2048, tok_base=1920, tok_reserved=8),
    "tiny-ragged": dict(layers=2, hidden=320, intermediate=448, moe_intermediate=192, heads=2, q_lora=192, kv_lora=160,
                        qk_nope=64, qk_rope=32, v_head=64, experts=8, shared=1, top_k=2, n_group=4, topk_group=2,
                        first_dense=1, vocab=2048, tok_base=1920, tok_reserved=8),
    # 16 experts over 4 groups: enough for expert parallelism at EP 16 (one expert a rank) in tests
    "tiny-e16": dict(layers=2, hidden=256, intermediate=512, moe_intermediate=128, heads=4, q_lora=128, kv_lora=128,
                     qk_nope=64, qk_rope=128, v_head=128, experts=16, shared=1, top_k=4, n_group=4, topk_group=2,
                     first_dense=1, vocab=2048, tok_base=1920, tok_reserved=8),
    "deepseek-v3": dict(layers=61, hidden=7168, intermediate=18432, moe_intermediate=2048, heads=128, q_lora=1536,
                        kv_lora=512, qk_nope=128, qk_rope=64, v_head=128, experts=256, shared=1, top_k=8, n_group=8,
                        topk_group=4, first_dense=3, vocab=129280, tok_base=128000, tok_reserved=798),
}

QWEN3: dict[str, dict] = {
    "tiny": dict(layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64, vocab=2048, tok_base=1920,
                 max_positions=40960),
    "tiny-ragged": dict(layers=2, hidden=320, intermediate=448, heads=5, kv_heads=1, head_dim=64, vocab=2048,
                        tok_base=1920, max_positions=40960),
    "qwen3-8b": dict(layers=36, hidden=4096, intermediate=12288, heads=32, kv_heads=8, head_dim=128, vocab=151936,
                     tok_base=151643, max_positions=40960),
}

QWEN3_MOE: dict[str, dict] = {
    # head_dim 128 with hidden 256: the q projection is wider than hidden, as in the 30B-A3B
    "tiny": dict(layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=128, experts=8, top_k=2,
                 moe_intermediate=128, vocab=2048, tok_base=1920, max_positions=40960),
    "tiny-ragged": dict(layers=2, hidden=320, intermediate=448, heads=4, kv_heads=2, head_dim=64, experts=8, top_k=2,
                        moe_intermediate=192, vocab=2048, tok_base=1920, max_positions=40960),
    "qwen3-30b-a3b": dict(layers=48, hidden=2048, intermediate=6144, heads=32, kv_heads=4, head_dim=128, experts=128,
                          top_k=8, moe_intermediate=768, vocab=151936, tok_base=151643, max_positions=40960),
    "qwen3-235b-a22b": dict(layers=94, hidden=4096, intermediate=12288, heads=64, kv_heads=4, head_dim=128, experts=128,
                            top_k=8, moe_intermediate=1536, vocab=151936, tok_base=151643, max_positions=40960),
}

PRESETS: dict[str, dict[str, dict]] = {
    "gpt-oss": GPT_OSS,
    "deepseek-v3": DEEPSEEK_V3,
    "qwen3": QWEN3,
    "qwen3-moe": QWEN3_MOE,
}


def dims(family: str, preset: str, layers: int | None) -> dict:
    """The preset's dimensions (a copy), with ``layers`` overriding the depth; a clear error otherwise."""
    if family not in PRESETS:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(PRESETS)}")
    table = PRESETS[family]
    if preset not in table:
        raise ValueError(f"family {family} has no preset {preset!r}; known: {', '.join(table)}")
    d = dict(table[preset])
    if layers is not None:
        if layers < 1:
            raise ValueError(f"--layers must be at least 1, got {layers}")
        d["layers"] = layers
    return d
