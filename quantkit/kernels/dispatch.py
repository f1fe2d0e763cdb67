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
* :func:`which` says, without running anything, which backend a call would use;
  :class:`Dispatcher` is an explicit object that runs ops and remembers which backend ran.

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
class Backend:
    op: str
    name: str
    fn: Callable[..., Any]
    available: Callable[[torch.device], Availability]
    priority: int  # auto runs the highest-priority backend available for auto


@dataclass(eq=False)  # compared by identity, usable as a default
class Registry:
    """op -> backend name -> :class:`Backend`; plus backends that could not be loaded at all."""

    ops: dict[str, dict[str, Backend]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # backend name -> why it is absent

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
    registry: Registry = REGISTRY,
) -> Backend:
    b = Backend(op, name, fn, available, priority)
    registry.add(b)
    return b


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


def which(op: str, device: torch.device | str, backend: str = AUTO) -> str:
    """Name of the backend that ``call(op, ..., backend=backend)`` runs for tensors on ``device``."""
    return REGISTRY.resolve(op, device, backend).name


def call(op: str, *args: Any, backend: str = AUTO, **kwargs: Any) -> Any:
    """Run ``op`` on the chosen backend (see module docstring)."""
    return REGISTRY.resolve(op, device_of(args, kwargs), backend).fn(*args, **kwargs)


@dataclass
class Dispatcher:
    """Runs ops through the registry and records which backend ran each one.

    ``backend`` is the default request for every op; ``per_op`` overrides it for single ops.
    """

    backend: str = AUTO
    per_op: dict[str, str] = field(default_factory=dict)
    registry: Registry = REGISTRY
    ran: dict[str, str] = field(default_factory=dict)  # op -> backend of its last call
    state: dict[Hashable, Any] = field(default_factory=dict)  # backends' long-lived objects (a FlashInfer wrapper), shared by its callers

    def want(self, op: str) -> str:
        """The backend requested for ``op`` (``per_op``, else the default)."""
        return self.per_op.get(op, self.backend)

    def which(self, op: str, device: torch.device | str) -> str:
        return self.registry.resolve(op, device, self.want(op)).name

    def call(self, op: str, *args: Any, backend: str | None = None, **kwargs: Any) -> Any:
        want = backend or self.want(op)
        b = self.registry.resolve(op, device_of(args, kwargs), want)
        self.ran[op] = b.name
        return b.fn(*args, **kwargs)

    def last_backend(self, op: str) -> str:
        if op not in self.ran:
            raise KeyError(f"op {op!r} has not run through this dispatcher")
        return self.ran[op]
