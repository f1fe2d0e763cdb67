"""The shard plan: for every source tensor, which piece each rank holds, grouped into files by the ranks sharing them.

A :class:`Piece` is one tensor as a rank holds it: whole, a [start, stop) range along one dim
(TP), or a list of global expert ids along dim 0 (GPT-OSS fused experts).  Pieces held by the
same set of ranks form a :class:`Group` that is written once and hard-linked into each of those
rank directories: ``shared`` (every rank: replicated tensors, and TP slices when tp = 1),
``tp<t>`` (TP slice t, held by its DP replicas), ``rank<r>`` (one rank: its routed experts, and
its TP slices when dp = 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..checkpoint import Checkpoint, TensorInfo
from ..modelconfig import ModelConfig
from ..modelshapes import verify
from . import geometry as geo
from .layout import Parallel, ShardError
from .placement import ExpertMap, load_stats, local_experts, place, read_load
from .rules import EXPERT_RE, LAYER_RE, Rule, match, table


@dataclass(frozen=True)
class Piece:
    name: str  # global tensor name, the same in the source and in every rank
    dtype: str
    shape: tuple[int, ...]  # local shape
    global_shape: tuple[int, ...]
    dim: int | None = None  # None: the whole tensor
    start: int = 0
    stop: int = 0
    experts: tuple[int, ...] | None = None  # fused experts: global ids along dim 0, local order

    def describe(self) -> dict | None:
        """The rank config's description of this slice (None when whole)."""
        if self.dim is None:
            return None
        d: dict = {"dim": self.dim, "global_shape": list(self.global_shape)}
        if self.experts is not None:
            d["experts"] = list(self.experts)
        else:
            d["start"], d["stop"] = self.start, self.stop
        return d


@dataclass
class Group:
    key: str
    ranks: tuple[int, ...]
    pieces: list[Piece] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(p) for p in self.pieces)


@dataclass
class Plan:
    src: Checkpoint
    family: str
    parallel: Parallel
    placement: str
    n_experts: int
    expert_map: ExpertMap
    load: dict | None
    groups: list[Group]

    def rank_pieces(self, rank: int) -> list[Piece]:
        return [p for g in self.groups if rank in g.ranks for p in g.pieces]

    def local_experts(self, rank: int) -> dict[int, list[int]]:
        return local_experts(self.expert_map, rank)


def _nbytes(p: Piece) -> int:
    return TensorInfo(p.name, p.dtype, p.shape, "").nbytes


def build(src: Checkpoint, par: Parallel, placement: str = "contiguous", expert_load: str | None = None) -> Plan:
    """Check every tensor against the family's table and the parallel sizes; plan every rank's pieces."""
    if src.layout != "root":
        raise ShardError(f"{src.root}: shard reads the HF root layout, not GPT-OSS's original/ folder")
    mc = verify(src)  # the config read once, checked against the tensors
    tbl = table(mc.family)
    rules = {n: match(tbl, n) for n in src.names()}
    layers, n_exp = _moe_layers(src, mc, rules)
    load = read_load(expert_load, layers, n_exp) if expert_load else None
    emap = place(placement, layers, n_exp, par.ep, load)
    stats = load_stats(emap, load, par.ep) if load else None
    groups = _Grouper(par)
    splitter = _Splitter(src, mc, par)
    for name, (rule, param) in rules.items():
        info = src.info(name)
        if rule.kind == "replicate":
            groups.add(groups.all, _whole(info))
        elif rule.kind == "expert":
            m = EXPERT_RE.match(name)
            assert m is not None
            groups.add((emap[int(m.group(1))][int(m.group(2))],), _whole(info))
        elif rule.kind == "fused":
            _add_fused(groups, par, info, emap[_layer(name)])
        else:
            for ranks, piece in splitter.pieces(info, rule, param):
                groups.add(ranks, piece)
    return Plan(src, mc.family, par, placement, n_exp, emap, stats, groups.done())


def _layer(name: str) -> int:
    m = LAYER_RE.match(name)
    assert m is not None, name
    return int(m.group(1))


def _moe_layers(src: Checkpoint, mc: ModelConfig, rules: dict[str, tuple[Rule, str]]) -> tuple[list[int], int]:
    """MoE layer ids (from the tensors) and the routed expert count (from the config, cross-checked)."""
    seen: dict[int, set[int]] = {}
    for name, (rule, _) in rules.items():
        if rule.kind == "expert":
            m = EXPERT_RE.match(name)
            assert m is not None
            seen.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
        elif rule.kind == "fused":
            seen.setdefault(_layer(name), set()).update(range(src.info(name).shape[0]))
    if not seen:
        return [], 0
    n = mc.experts
    if n == 0:
        raise ShardError(f"{src.root / 'config.json'}: routed expert tensors present but the config describes a dense model")
    for layer, ids in sorted(seen.items()):
        if ids != set(range(n)):
            extra = sorted(ids - set(range(n)))
            what = f"experts {extra[:4]} beyond {n}" if extra else f"only {len(ids)} of {n} experts"
            raise ShardError(f"{src.root}: layer {layer} has {what} (config says {n}): missing or extra expert tensors")
    return sorted(seen), n


def _whole(info: TensorInfo) -> Piece:
    return Piece(info.name, info.dtype, info.shape, info.shape)


def _add_fused(groups: _Grouper, par: Parallel, info: TensorInfo, owners: list[int]) -> None:
    if par.ep == 1:
        groups.add(groups.all, _whole(info))
        return
    for r in range(par.ep):
        ids = tuple(e for e, o in enumerate(owners) if o == r)
        shape = (len(ids), *info.shape[1:])
        groups.add((r,), Piece(info.name, info.dtype, shape, info.shape, 0, experts=ids))


class _Grouper:
    """Collects pieces by the set of ranks that hold them; names each set."""

    def __init__(self, par: Parallel) -> None:
        self.par = par
        self.all = tuple(range(par.world))
        self.groups: dict[tuple[int, ...], Group] = {}

    def key(self, ranks: tuple[int, ...]) -> str:
        if ranks == self.all:
            return "shared"
        if len(ranks) == 1:
            return f"rank{ranks[0]:05d}"
        return f"tp{self.par.coords(ranks[0]).tp:05d}"

    def add(self, ranks: tuple[int, ...], piece: Piece) -> None:
        if ranks not in self.groups:
            self.groups[ranks] = Group(self.key(ranks), ranks)
        self.groups[ranks].pieces.append(piece)

    def done(self) -> list[Group]:
        return sorted(self.groups.values(), key=lambda g: (g.key != "shared", g.key))


class _Splitter:
    """Column/row splits: one weight-space split per module, carried to its weight, bias and scales."""

    def __init__(self, src: Checkpoint, mc: ModelConfig, par: Parallel) -> None:
        self.src = src
        self.mc = mc
        self.par = par
        self.cache: dict[str, list[geo.Range]] = {}

    def pieces(self, info: TensorInfo, rule: Rule, param: str) -> list[tuple[tuple[int, ...], Piece]]:
        if self.par.tp == 1 or (rule.kind == "row" and param == "bias"):
            return [(tuple(range(self.par.world)), _whole(info))]
        module = info.name[: len(info.name) - len(param)].rstrip(".") if param else info.name
        ranges = self._module_ranges(module, info, rule)
        dim, block = 0 if rule.kind == "column" else len(info.shape) - 1, 1
        if param in geo.SCALE_PARAMS:
            if info.numel == 1:  # per-tensor scale
                return [(tuple(range(self.par.world)), _whole(info))]
            block = geo.scale_blocks(info.dtype, info.name)[0 if rule.kind == "column" else 1]
        out = []
        for t, (a, b) in enumerate(ranges):
            a, b = a // block, -(-b // block)
            shape = tuple(b - a if i == dim else s for i, s in enumerate(info.shape))
            out.append((self.par.tp_group(t), Piece(info.name, info.dtype, shape, info.shape, dim, a, b)))
        return out

    def _module_ranges(self, module: str, info: TensorInfo, rule: Rule) -> list[geo.Range]:
        if module in self.cache:
            return self.cache[module]
        weight = self.src.tensors.get(f"{module}.weight")
        shape = weight.shape if weight is not None else info.shape
        wname = weight.name if weight is not None else info.name
        col = rule.kind == "column"
        size = shape[0] if col else shape[-1]
        block, block_label = 1, ""
        for p in geo.SCALE_PARAMS:
            s = self.src.tensors.get(f"{module}.{p}")
            if s is None or s.numel == 1:
                continue
            if weight is None:
                raise ShardError(f"{s.name}: a block scale without its weight {module}.weight")
            blocks = geo.scale_blocks(s.dtype, s.name)
            geo.check_scale_shape(s.name, s.shape, shape, blocks)
            block = max(block, blocks[0 if col else 1])
            block_label = "FP8-block 128x128 tiles" if blocks == (128, 128) else "MXFP8 1x32 blocks along K"
        units = int(getattr(self.mc, rule.units)) if rule.units else None
        label = ("output rows" if col else "input columns") + (f" ({units} {'KV ' if rule.kv else ''}heads)" if units else "")
        ranges = geo.split(wname, label=label, size=size, units=units, kv=rule.kv, tp=self.par.tp,
                           ep=self.par.ep, block=block, block_label=block_label)
        self.cache[module] = ranges
        return ranges
