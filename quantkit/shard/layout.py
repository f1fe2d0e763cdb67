"""Parallel sizes and rank coordinates, as in DeepSeek-V3's deployment: EP = DP x TP.

Attention and dense weights are split over TP and replicated over DP; the MoE layers use all
DP x TP ranks as one EP group.  rank = dp_rank x TP + tp_rank, and ep_rank = rank.  Rank
directories are ``rank-00003-of-00016``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint import CheckpointError


class ShardError(CheckpointError):
    """A shard request that no rule covers; the message names the tensor or option and what works."""


@dataclass(frozen=True)
class Coords:
    rank: int
    dp: int
    tp: int
    ep: int


@dataclass(frozen=True)
class Parallel:
    ep: int
    tp: int
    dp: int

    @classmethod
    def make(cls, ep: int, tp: int = 1, dp: int | None = None) -> Parallel:
        for flag, v in (("--ep", ep), ("--tp", tp), ("--dp", dp)):
            if v is not None and v < 1:
                raise ShardError(f"{flag} must be at least 1, got {v}")
        if dp is None:
            if ep % tp:
                raise ShardError(f"--ep {ep} is not a multiple of --tp {tp}: EP = DP x TP, so --tp must divide --ep")
            dp = ep // tp
        if dp * tp != ep:
            raise ShardError(f"--ep {ep} must equal --dp x --tp (got {dp} x {tp} = {dp * tp}): the MoE layers use every DP x TP rank")
        return cls(ep, tp, dp)

    @property
    def world(self) -> int:
        return self.ep

    def coords(self, rank: int) -> Coords:
        return Coords(rank, rank // self.tp, rank % self.tp, rank)

    def ranks(self) -> list[Coords]:
        return [self.coords(r) for r in range(self.world)]

    def tp_group(self, tp_rank: int) -> tuple[int, ...]:
        """Ranks holding TP slice ``tp_rank`` (one per DP replica)."""
        return tuple(d * self.tp + tp_rank for d in range(self.dp))

    def rank_dir(self, rank: int) -> str:
        return f"rank-{rank:05d}-of-{self.world:05d}"

    def as_dict(self) -> dict:
        return {"world_size": self.world, "ep": self.ep, "tp": self.tp, "dp": self.dp}
