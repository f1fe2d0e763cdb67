"""The one environment record of a benchmark run, and the device peaks its rates are measured against.

:func:`environment` is what every result record carries (``record.Run.env``): the device (name, compute
capability, SMs, driver), the CPU and OS, the versions of python, torch, CUDA, Triton, safetensors and
quantkit, torch's thread count and the git commit of the tree that ran.  No host name, user or path.
Versions of packages that need not be imported (Triton, safetensors) come from their installed metadata, so
recording the environment never imports Triton before ``--device cpu`` has chosen its interpreter.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

# device name substring -> (dense FP8 TFLOPS, dense BF16 TFLOPS, HBM GB/s), NVIDIA datasheets; first match wins
PEAKS: dict[str, tuple[float, float, float]] = {
    "H200 NVL": (1671.0, 835.0, 4800.0),
    "H200": (1979.0, 989.0, 4800.0),
    "H100 NVL": (1671.0, 835.0, 3900.0),
    "H100": (1979.0, 989.0, 3350.0),
    "B200": (4500.0, 2250.0, 8000.0),
}
CPU_PEAKS = (1.0, 1.0, 50.0)  # placeholder figures for the CPU smoke runs
SOURCE = Path(__file__).resolve().parents[2]  # the tree this package was imported from


def peaks(device_name: str) -> tuple[float, float, float] | None:
    """(FP8, BF16 dense TFLOPS, HBM GB/s) of a CUDA device by name; ``CPU_PEAKS`` for "cpu"; None if unknown."""
    if device_name == "cpu":
        return CPU_PEAKS
    return next((p for key, p in PEAKS.items() if key in device_name), None)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        name = ""
    return f"{name or platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def git_commit(root: Path = SOURCE) -> str:
    """The commit of ``root`` (12 hex digits, ``+dirty`` when tracked files differ from it), or why there is none."""
    try:
        run = lambda *a: subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True, check=True).stdout.strip()  # noqa: E731
        dirty = run("status", "--porcelain", "--untracked-files=no")
        return run("rev-parse", "--short=12", "HEAD") + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError) as err:
        return f"unknown ({type(err).__name__})"


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, check=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError) as err:
        return f"unknown ({type(err).__name__})"


def environment(device: str = "cpu") -> dict[str, str]:
    """The environment record of a run on ``device`` ("cpu", "cuda" or "cuda:N"); every value a string."""
    import torch

    import quantkit

    env = {"device": "cpu"}
    if device != "cpu":
        dev = torch.device(device)
        props = torch.cuda.get_device_properties(dev)
        env = {"device": torch.cuda.get_device_name(dev), "capability": f"{props.major}.{props.minor}",
               "sms": str(props.multi_processor_count), "driver": _driver()}  # fmt: skip
    env |= {"cpu": _cpu(), "os": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cuda": str(torch.version.cuda), "triton": _version("triton"), "safetensors": _version("safetensors"),
            "quantkit": quantkit.__version__, "torch_threads": str(torch.get_num_threads()), "git": git_commit()}  # fmt: skip
    return env
