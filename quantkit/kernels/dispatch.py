"""The one kernel dispatch point: an op name maps to backends that compute the same function.

Every op is defined by its pure-torch reference from :mod:`quantkit.formats`, registered as
backend ``"torch"`` (available on every device).  Faster backends (``"triton"``, later
``"cublas"``, ``"flashinfer"``) register under the same op with an availability predicate and a
priority; they must return exactly what the reference returns (bit for bit where the op is exact).

    dispatch.call("mxfp4_decode", blocks, scales, torch.bfloat16, backend="auto")

* ``backend="auto"`` runs the highest-priority backend that is available *for auto* on the
  device of the op's first tensor argument (the torch reference when nothing faster is).
* an explicit backend that is unknown or unavailable raises :class:`BackendUnavailable`, with
  the predicate's reason; there is no silent fallback.
* a backend with several kernels (tile shapes, a skinny GEMV, DeepGEMM ...) registers one selection function
  (``select``): given the call's arguments it returns the :class:`Choice` -- the leaf kernel, its config and the
  one-line rule that picked it -- and the leaf runs; nothing below it chooses again.
* :func:`which` says, without running anything, which backend a call on a device would use, or, given the
  call's arguments, which leaf kernel; :func:`choose` returns the whole :class:`Choice`; :class:`Dispatcher` is an
  explicit object that runs ops and remembers which leaf ran (``ran``).
* :func:`kernel_map` lists, per op, the leaf each representative call runs on a :class:`Target` (``quantkit
  kernels`` prints it), from the map functions the subpackages register (:func:`register_map`).

The registry (:data:`REGISTRY`) is the only module-level state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

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
    """The leaf kernel one call runs: its name (``"<backend>"`` or ``"<backend>.<kernel>"``), its launch config (a
    tuning table's row; None where the kernel has one launch) and the rule that chose it, in one line."""

    kernel: str
    config: Any = None
    reason: str = ""
    run: Callable[..., Any] | None = field(default=None, compare=False, repr=False)  # the leaf, config bound; None: the backend's fn

    def __str__(self) -> str:
        return self.kernel + (f" [{self.config}]" if self.config is not None else "")


@dataclass(frozen=True)
class Backend:
    op: str
    name: str
    fn: Callable[..., Any]
    available: Callable[[torch.device], Availability]
    priority: int  # auto runs the highest-priority backend available for auto
    select: Callable[..., Choice] | None = None  # the op's selection function for this backend (call arguments -> Choice)

    def choose(self, *args: Any, **kwargs: Any) -> Choice:
        return self.select(*args, **kwargs) if self.select is not None else Choice(self.name, reason="the backend's only kernel")

    def run(self, *args: Any, **kwargs: Any) -> tuple[str, Any]:
        """(the leaf kernel that ran, its result)."""
        if self.select is None:
            return self.name, self.fn(*args, **kwargs)
        c = self.select(*args, **kwargs)
        return c.kernel, (c.run or self.fn)(*args, **kwargs)


@dataclass(frozen=True)
class Target:
    """What a selection function may ask of a device: its type, compute capability, SM count, and which optional
    backends it has (None: ask the device).  A named target (:data:`TARGETS`) lets any machine print the map of a
    device it does not have."""

    type: str
    capability: tuple[int, int] = (0, 0)
    sms: int = 8
    name: str = ""
    optional: frozenset[str] | None = None  # e.g. {"deepgemm", "flashinfer"}; None: probe the device

    @property
    def sm90(self) -> bool:
        return self.type == "cuda" and self.capability == (9, 0)

    def has(self, backend: str, device: torch.device | None = None, op: str | None = None) -> bool:
        """Whether an optional backend runs here: the named set, else the registry's predicate on ``device``."""
        if self.optional is not None:
            return backend in self.optional
        if device is None or op is None:
            return False
        b = REGISTRY.ops.get(op, {}).get(backend)
        return b is not None and b.available(torch.device(device)).ok


TARGETS = {"h200": Target("cuda", (9, 0), 132, "NVIDIA H200", frozenset({"deepgemm", "flashinfer"}))}


@dataclass(frozen=True)
class MapRow:
    """One line of the kernel map: an op, the case (format, shape), the M bucket, and the :class:`Choice`."""

    op: str
    case: str
    m: str
    choice: Choice


@dataclass(eq=False)  # compared by identity, usable as a default
class Registry:
    """op -> backend name -> :class:`Backend`; plus backends that could not be loaded at all."""

    ops: dict[str, dict[str, Backend]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # backend name -> why it is absent
    maps: dict[str, Callable[[Target], list[MapRow]]] = field(default_factory=dict)  # op -> its kernel map

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
        try:
            return self.ops[op]
        except KeyError:
            raise KeyError(f"unknown op {op!r}; known: {', '.join(sorted(self.ops))}") from None

    def ranked(self, op: str) -> list[Backend]:
        """Backends of ``op``, highest priority first."""
        return sorted(self.table(op).values(), key=lambda b: -b.priority)

    def resolve(self, op: str, device: torch.device | str, backend: str = AUTO) -> Backend:
        """The backend a call of ``op`` on ``device`` runs; raises when an explicit one cannot."""
        device = torch.device(device)
        if backend == AUTO:
            for b in self.ranked(op):
                a = b.available(device)
                if a.ok and a.auto:
                    return b
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
    registry: Registry = REGISTRY,
) -> Backend:
    b = Backend(op, name, fn, available, priority, select)
    registry.add(b)
    return b


def register_map(op: str, fn: Callable[[Target], list[MapRow]], registry: Registry = REGISTRY) -> None:
    """``fn(target)``: the map rows of ``op`` (its representative calls and the leaf each runs) on a target."""
    registry.maps[op] = fn


def kernel_map(target: Target, registry: Registry = REGISTRY) -> list[MapRow]:
    """Every registered op's map rows on ``target``; an op without a map function is one row, its auto backend."""
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
    """The :class:`Target` of a device (asked once per device)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _target(device)


def backend(op: str, name: str, **kw: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator form of :func:`register`; returns the function unchanged."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        register(op, name, fn, **kw)
        return fn

    return deco


def register_missing(name: str, reason: str, registry: Registry = REGISTRY) -> None:
    """Record that backend ``name`` could not be loaded (e.g. its package does not import)."""
    registry.missing[name] = reason


def ops() -> list[str]:
    return sorted(REGISTRY.ops)


def backends(op: str) -> list[str]:
    """Registered backends of ``op``, highest priority first."""
    return [b.name for b in REGISTRY.ranked(op)]


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) of a CUDA device, asked of the driver once per device (launchers ask on
    every call: torch's own query costs several microseconds of host time each)."""
    return _capability(torch.cuda.current_device() if device.index is None else device.index)


SM90_SMEM = 232448  # bytes of dynamic shared memory one block may use on sm_90


def wave_key(tiles: int, sms: int) -> tuple[int, int]:
    """How ``tiles`` equal programs fill ``sms`` SMs, smaller is better: (waves, minus the programs of the last
    wave) -- DeepGEMM's tile rule, fewest waves then the fullest last one."""
    return -(-tiles // sms), -(tiles % sms or sms)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device, asked once per device (grid sizing); 8 elsewhere, so
    the CPU interpreter's small grids still exercise split-K and split-KV paths."""
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
    """Given a device: the backend that ``call(op, ..., backend=backend)`` runs for tensors on it.  Given the call's
    arguments instead (``which(op, a, a_scale, w, ...)``): the leaf kernel it runs (:attr:`Choice.kernel`)."""
    if isinstance(device, torch.Tensor) or args or kwargs:
        return choose(op, device, *args, backend=backend, **kwargs).kernel
    return REGISTRY.resolve(op, device, backend).name


def choose(op: str, *args: Any, backend: str = AUTO, **kwargs: Any) -> Choice:
    """The :class:`Choice` that ``call(op, *args, backend=backend, **kwargs)`` runs, without running it."""
    return REGISTRY.resolve(op, device_of(args, kwargs), backend).choose(*args, **kwargs)


def call(op: str, *args: Any, backend: str = AUTO, **kwargs: Any) -> Any:
    """Run ``op`` on the chosen backend's chosen leaf (see module docstring)."""
    return REGISTRY.resolve(op, device_of(args, kwargs), backend).run(*args, **kwargs)[1]


@dataclass
class Dispatcher:
    """Runs ops through the registry and records which backend ran each one.

    ``backend`` is the default request for every op; ``per_op`` overrides it for single ops.
    """

    backend: str = AUTO
    per_op: dict[str, str] = field(default_factory=dict)
    registry: Registry = REGISTRY
    ran: dict[str, str] = field(default_factory=dict)  # op -> the leaf kernel of its last call (Choice.kernel)
    state: dict[Hashable, Any] = field(default_factory=dict)  # backends' long-lived objects (a FlashInfer wrapper), shared by its callers

    def want(self, op: str) -> str:
        """The backend requested for ``op`` (``per_op``, else the default)."""
        return self.per_op.get(op, self.backend)

    def which(self, op: str, device: Any, *args: Any, **kwargs: Any) -> str:
        """As :func:`which`, with this dispatcher's request for ``op``."""
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
