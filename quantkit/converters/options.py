"""Options of ``quantkit convert`` and the rules that tie them together.

Only the options that change output bytes (``to``, rounding, seed and the rounding hash's id,
scale rule and format, ``ignore``, shard size) enter the resume job and ``quantkit.json``; ``workers`` and ``device``
change how fast the bytes are produced, never which bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .. import formats
from ..formats import e8m0
from ..formats.fp8_block import SCALE_FMTS
from ..formats.rounding import HASH_ID, MODES, Rounding

DEVICES = ("cpu", "cuda")
DEFAULT_SHARD_SIZE = 5_000_000_000  # 5 GB, as transformers' save_pretrained
# elements per chunk of work, by device: bounds the float32 temporaries (about 40 bytes per element
# on CPU) whatever the tensor size; a GPU wants larger launches
CHUNK_ELEMENTS = {"cpu": 1 << 20, "cuda": 1 << 24}


class OptionError(ValueError):
    """Options that contradict each other; the message says which and why."""


@dataclass(frozen=True)
class ConvertOptions:
    to: str
    rounding: str = "nearest"
    seed: int | None = None
    scale_rule: str | None = None  # None: e8m0.DEFAULT_RULE where a rule applies
    scale_fmt: str | None = None  # fp8-block only; None: the source's fp8-block scale format, else "float"
    ignore: tuple[str, ...] = ()
    device: str = "cpu"
    workers: int = 1
    max_shard_size: int = DEFAULT_SHARD_SIZE
    resume: bool = False
    force: bool = False
    dry_run: bool = False
    chunk_elements: int | None = None  # None: CHUNK_ELEMENTS[device]

    def __post_init__(self) -> None:
        check(self)

    @property
    def chunk(self) -> int:
        return self.chunk_elements or CHUNK_ELEMENTS[self.device]

    @property
    def rule(self) -> str:
        return self.scale_rule or e8m0.DEFAULT_RULE

    def base_rounding(self) -> Rounding:
        return Rounding(self.rounding, self.seed or 0)  # type: ignore[arg-type]

    def output_options(self, scale_fmt: str | None) -> dict:
        """The options that decide output bytes, as recorded in quantkit.json and the resume job."""
        d = asdict(self)
        keep = ("to", "rounding", "seed", "scale_rule", "ignore", "max_shard_size")
        out = {k: d[k] for k in keep}
        out["ignore"] = list(self.ignore)
        out["scale_rule"] = self.rule if uses_rule(self.to, scale_fmt) else None
        out["scale_fmt"] = scale_fmt
        out["seed"] = (self.seed or 0) if self.rounding == "stochastic" else None
        out["rounding_hash"] = HASH_ID if self.rounding == "stochastic" else None
        return out


def uses_rule(to: str, scale_fmt: str | None) -> bool:
    """An E8M0 scale rule decides bytes for mxfp8, mxfp4 and power-of-two fp8-block scales (the target format says)."""
    return formats.get(to).uses_rule(scale_fmt)


def _rule_targets() -> tuple[list[str], list[str]]:
    """(targets whose scales are E8M0, targets with a --scale-fmt choice): whom --scale-rule and --scale-fmt concern."""
    fs = [formats.get(n) for n in formats.convert_targets()]
    return [f.name for f in fs if f.weight_scale is not None and f.weight_scale.e8m0], [f.name for f in fs if f.scale_fmts]


def _check_scales(o: ConvertOptions, fmt: formats.Format) -> None:
    e8, choosing = _rule_targets()
    if o.scale_rule is not None:
        e8m0.check_rule(o.scale_rule)
        if not fmt.uses_rule(o.scale_fmt) and not (fmt.scale_fmts and o.scale_fmt is None):  # an unset --scale-fmt may be ue8m0
            raise OptionError(f"--scale-rule applies to --to {', '.join(e8)} and to {', '.join(choosing)} with --scale-fmt ue8m0 only")
    if o.scale_fmt is not None:
        if o.scale_fmt not in SCALE_FMTS:
            raise OptionError(f"--scale-fmt must be one of {', '.join(SCALE_FMTS)}, not {o.scale_fmt!r}")
        if not fmt.scale_fmts:
            raise OptionError(f"--scale-fmt applies to --to {', '.join(choosing)} only ({' and '.join(e8)} scales are always E8M0)")


def check(o: ConvertOptions) -> None:
    targets = formats.convert_targets()
    if o.to not in targets:
        raise OptionError(f"--to must be one of {', '.join(targets)}, not {o.to!r}")
    if o.rounding not in MODES:
        raise OptionError(f"--rounding must be one of {', '.join(MODES)}, not {o.rounding!r}")
    if o.seed is not None and o.rounding != "stochastic":
        raise OptionError("--seed only applies with --rounding stochastic")
    _check_scales(o, formats.get(o.to))
    if o.device not in DEVICES:
        raise OptionError(f"--device must be one of {', '.join(DEVICES)}, not {o.device!r}")
    if o.workers < 1:
        raise OptionError(f"--workers must be at least 1, not {o.workers}")
    if o.max_shard_size < 1:
        raise OptionError(f"--max-shard-size must be positive, not {o.max_shard_size}")
    if o.chunk_elements is not None and o.chunk_elements < 1:
        raise OptionError(f"chunk_elements must be positive, not {o.chunk_elements}")
    if o.resume and o.dry_run:
        raise OptionError("--resume and --dry-run exclude each other")
