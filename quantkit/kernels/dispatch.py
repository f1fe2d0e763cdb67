"""The one kernel dispatch point: an op name maps to backends that compute the same function.

Each op's pure-torch reference is backend ``"torch"`` (every device).  Faster backends register under the op with
an availability predicate and a priority, and return what the reference returns (bit for bit where it is exact).

* ``backend="auto"`` runs the highest-priority backend available for auto on the device of the first tensor
  argument; an explicit backend that is unknown or unavailable raises :class:`BackendUnavailable` (no fallback).
* A backend of several kernels registers one selection function (``select``; ``auto_select`` where auto may also
  pick another backend's kernel): call arguments -> :class:`Choice` (leaf kernel, config, rule).  The leaf runs;
  nothing below it chooses again.  ``Dispatcher.ran`` and :func:`which` given the operands name the leaf.
* :func:`kernel_map`: the leaf of each op's representative calls on a :class:`Target` (``quantkit kernels``).
* A format's ops (:data:`quantkit.formats.Format.references`, its GEMM) have their references registered when the
  kernels load, or, for a format registered later, when the op is first asked for.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import formats

AUTO = "auto"
REFERENCE = "torch"


class BackendUnavailable(RuntimeError):
    """An explicitly requested backend does not exist for the op or cannot run on the device."""


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run on a device, and whether ``backend="auto"`` may choose it."""

    ok: bool
    auto: bool = True
    reason: str = ""


ALWAYS = Availability(True)


def always(device: torch.device) -> Availability:
    return ALWAYS


@dataclass(frozen=True)
class Choice:
    """The leaf one call runs (``"<backend>"`` or ``"<backend>.<kernel>"``), its config and the rule that chose it."""

    kernel: str
    config: Any = None
    reason: str = ""
    run: Callable[..., Any] | None = field(default=None, compare=False, repr=False)  # the leaf, config bound

    def __str__(self) -> str:
        return self.kernel + (f" [{self.config}]" if self.config is not None else "")


@dataclass(frozen=True)
class Backend:
    op: str
    name: str
    fn: Callable[..., Any]
    available: Callable[[torch.device], Availability]
    priority: int  # auto runs the highest-priority backend available for auto
    select: Callable[..., Choice] | None = None  # call arguments -> Choice
    auto_select: Callable[..., Choice] | None = None  # the same under auto (None: select); may pick other backends' leaves

    @functools.cached_property
    def for_auto(self) -> Backend:
        return self if self.auto_select is None else dataclasses.replace(self, select=self.auto_select, auto_select=None)

    def choose(self, *args: Any, **kwargs: Any) -> Choice:
        return self.select(*args, **kwargs) if self.select is not None else Choice(self.name, reason="the backend's only kernel")

    def run(self, *args: Any, **kwargs: Any) -> tuple[str, Any]:
        if self.select is None:
            return self.name, self.fn(*args, **kwargs)
        c = self.select(*args, **kwargs)
        return c.kernel, (c.run or self.fn)(*args, **kwargs)


@dataclass(frozen=True)
class Target:
    """What a selection function may ask of a device.  A named one (:data:`TARGETS`) maps a device not present."""

    type: str
    capability: tuple[int, int] = (0, 0)
    sms: int = 8
    name: str = ""
    optional: frozenset[str] | None = None  # optional backends present; None: ask the registry

    def has(self, backend: str, device: torch.device | None = None, op: str | None = None) -> bool:
        if self.optional is not None:
            return backend in self.optional
        if device is None or op is None:
            return False
        b = REGISTRY.ops.get(op, {}).get(backend)
        return b is not None and b.available(torch.device(device)).ok


TARGETS = {"h200": Target("cuda", (9, 0), 132, "NVIDIA H200", frozenset({"deepgemm", "flashinfer", "wgmma"}))}


@dataclass(frozen=True)
class MapRow:
    """One line of the kernel map."""

    op: str
    case: str
    m: str
    choice: Choice


@dataclass(eq=False)  # compared by identity, usable as a default
class Registry:
    """op -> backend name -> :class:`Backend`; backends that could not load; op -> its map function."""

    ops: dict[str, dict[str, Backend]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    maps: dict[str, Callable[[Target], list[MapRow]]] = field(default_factory=dict)

    def add(self, b: Backend) -> None:
        if b.name == AUTO:
            raise ValueError(f"{AUTO!r} is not a backend name")
        if b.name != REFERENCE and b.op not in self.ops:
            raise ValueError(f"op {b.op!r}: register its {REFERENCE!r} reference before backend {b.name!r}")
        table = self.ops.setdefault(b.op, {})
        if b.name in table:
            raise ValueError(f"op {b.op!r}: backend {b.name!r} registered twice")
        table[b.name] = b

    def table(self, op: str) -> dict[str, Backend]:
        if op not in self.ops:
            ref = formats.reference(op)  # an op of a format registered after the kernels loaded: its reference
            if ref is None:
                raise KeyError(f"unknown op {op!r}; known: {', '.join(sorted(self.ops))}")
            self.add(Backend(op, REFERENCE, ref, always, 0))
        return self.ops[op]

    def ranked(self, op: str) -> list[Backend]:
        return sorted(self.table(op).values(), key=lambda b: -b.priority)

    def resolve(self, op: str, device: torch.device | str, backend: str = AUTO) -> Backend:
        device = torch.device(device)
        if backend == AUTO:
            for b in self.ranked(op):
                a = b.available(device)
                if a.ok and a.auto:
                    return b.for_auto
            raise BackendUnavailable(f"op {op!r}: no backend available on {device}")
        table = self.table(op)
        if backend not in table:
            why = self.missing.get(backend, "not registered for this op")
            known = ", ".join(b.name for b in self.ranked(op))
            raise BackendUnavailable(f"op {op!r}: backend {backend!r} unavailable: {why}; registered: {known}")
        b = table[backend]
        a = b.available(device)
        if not a.ok:
            raise BackendUnavailable(f"op {op!r}: backend {backend!r} cannot run on {device}: {a.reason}")
        return b


REGISTRY = Registry()


def register(
    op: str,
    name: str,
    fn: Callable[..., Any],
    *,
    available: Callable[[torch.device], Availability] = always,
    priority: int = 0,
    select: Callable[..., Choice] | None = None,
    auto_select: Callable[..., Choice] | None = None,
    registry: Registry = REGISTRY,
) -> Backend:
    b = Backend(op, name, fn, available, priority, select, auto_select)
    registry.add(b)
    return b


def register_map(op: str, fn: Callable[[Target], list[MapRow]], registry: Registry = REGISTRY) -> None:
    registry.maps[op] = fn


def kernel_map(target: Target, registry: Registry = REGISTRY) -> list[MapRow]:
    """The rows of every op that registered a map function."""
    rows: list[MapRow] = []
    for op in sorted(registry.ops):
        if op in registry.maps:
            rows += registry.maps[op](target)
    return rows


@functools.cache
def _target(device: torch.device) -> Target:
    if device.type != "cuda":
        return Target(device.type, name=device.type)
    return Target("cuda", capability(device), sm_count(device), torch.cuda.get_device_name(device))


def target(device: torch.device | str) -> Target:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _target(device)


def backend(op: str, name: str, **kw: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        register(op, name, fn, **kw)
        return fn

    return deco


def register_missing(name: str, reason: str, registry: Registry = REGISTRY) -> None:
    registry.missing[name] = reason


def ops() -> list[str]:
    return sorted(REGISTRY.ops)


def backends(op: str) -> list[str]:
    return [b.name for b in REGISTRY.ranked(op)]


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def capability(device: torch.device) -> tuple[int, int]:
    """Cached per device: torch's query costs microseconds of host time, and launchers ask on every call."""
    return _capability(torch.cuda.current_device() if device.index is None else device.index)


SM90_SMEM = 232448  # bytes of dynamic shared memory one block may use on sm_90


def wave_key(tiles: int, sms: int) -> tuple[int, int]:
    """Sort key of a tiling on ``sms`` SMs: fewest waves, then the fullest last wave (DeepGEMM's rule)."""
    return -(-tiles // sms), -(tiles % sms or sms)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """SMs of a CUDA device (cached); 8 elsewhere, so the interpreter's small grids still split K and KV."""
    device = torch.device(device)
    if device.type != "cuda":
        return 8
    return _sm_count(torch.cuda.current_device() if device.index is None else device.index)


def device_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a.device
    raise TypeError("dispatch: the op has no tensor argument to take a device from")


def which(op: str, device: Any, *args: Any, backend: str = AUTO, **kwargs: Any) -> str:
    """The backend a call on ``device`` runs; given the call's arguments instead, the leaf kernel."""
    if isinstance(device, torch.Tensor) or args or kwargs:
        return choose(op, device, *args, backend=backend, **kwargs).kernel
    return REGISTRY.resolve(op, device, backend).name


def choose(op: str, *args: Any, backend: str = AUTO, **kwargs: Any) -> Choice:
    """The :class:`Choice` that ``call`` would run."""
    return REGISTRY.resolve(op, device_of(args, kwargs), backend).choose(*args, **kwargs)


def call(op: str, *args: Any, backend: str = AUTO, **kwargs: Any) -> Any:
    return REGISTRY.resolve(op, device_of(args, kwargs), backend).run(*args, **kwargs)[1]


@dataclass
class Dispatcher:
    """Runs ops through the registry (``backend`` for every op, ``per_op`` overrides) and records the leaf that ran."""

    backend: str = AUTO
    per_op: dict[str, str] = field(default_factory=dict)
    registry: Registry = REGISTRY
    ran: dict[str, str] = field(default_factory=dict)  # op -> leaf of its last call
    state: dict[Hashable, Any] = field(default_factory=dict)  # backends' long-lived objects (a FlashInfer wrapper)

    def want(self, op: str) -> str:
        return self.per_op.get(op, self.backend)

    def which(self, op: str, device: Any, *args: Any, **kwargs: Any) -> str:
        if isinstance(device, torch.Tensor) or args or kwargs:
            return self.choose(op, device, *args, **kwargs).kernel
        return self.registry.resolve(op, device, self.want(op)).name

    def choose(self, op: str, *args: Any, **kwargs: Any) -> Choice:
        return self.registry.resolve(op, device_of(args, kwargs), self.want(op)).choose(*args, **kwargs)

    def call(self, op: str, *args: Any, backend: str | None = None, **kwargs: Any) -> Any:
        b = self.registry.resolve(op, device_of(args, kwargs), backend or self.want(op))
        self.ran[op], out = b.run(*args, **kwargs)
        return out

    def last_backend(self, op: str) -> str:
        if op not in self.ran:
            raise KeyError(f"op {op!r} has not run through this dispatcher")
        return self.ran[op]
