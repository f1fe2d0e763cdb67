"""EP/TP/DP sharding of a checkpoint into per-rank directories (``quantkit shard``).

Layout written (DST)::

    DST/quantkit.json                      the plan: parallel sizes, rank -> (dp, tp, ep), expert -> rank
                                           map per MoE layer, groups of shared files, per-file sha256
    DST/rank-00000-of-00016/               a checkpoint directory a loader opens on its own:
        model.safetensors.index.json       this rank's tensors -> files
        config.json                        the source config + ``quantkit_shard`` (coordinates,
                                           this rank's experts per layer, every split tensor's
                                           dim/start/stop or expert ids and global shape)
        model-shared-00001-of-00001.safetensors   replicated tensors (hard link, one inode for all ranks)
        model-tp00001-00001-of-00001.safetensors  TP slice 1 (hard link among its DP replicas)
        model-rank00000-00001-of-00002.safetensors  this rank's routed experts
        tokenizer.json, ...                side files (hard links)

Semantics (DeepSeek-V3's deployment): EP = DP x TP; rank = dp_rank x TP + tp_rank = ep_rank.
Routed experts are partitioned over the EP ranks and never split; attention and dense/shared
MLP weights are split over TP (column-parallel on output rows, row-parallel on input columns,
q/k/v by heads, KV heads replicated when TP exceeds them); everything else is replicated.
Tensor names stay global: per-expert tensors keep their global ids; a GPT-OSS fused expert
tensor [E_local, ...] holds at local index i the global expert ``splits[name]["experts"][i]``
(ascending).  Split tables: :mod:`quantkit.shard.rules`.
"""

from __future__ import annotations

from .api import shard, summary
from .layout import Parallel, ShardError
from .plan import build
from .verify import verify

__all__ = ["shard", "summary", "build", "verify", "Parallel", "ShardError"]
