"""quantkit.bench.env (the environment record, device peaks) and quantkit.bench.timer's CPU path."""

from __future__ import annotations

import json
import platform
import re
import time

import torch

from quantkit.bench.env import CPU_PEAKS, environment, git_commit, peaks
from quantkit.bench.timer import CPU_CALLS, Timer


def test_the_environment_record_names_versions_and_commit_but_not_the_host():
    env = environment("cpu")
    assert {"device", "cpu", "os", "python", "torch", "cuda", "triton", "safetensors", "quantkit", "torch_threads", "git"} <= set(env)
    assert env["device"] == "cpu" and env["torch"] == torch.__version__ and env["python"] == platform.python_version()
    assert all(isinstance(v, str) and v for v in env.values()), env
    assert re.fullmatch(r"[0-9a-f]{12}(\+dirty)?|unknown \(\w+\)", env["git"]), env["git"]
    host = platform.node()
    assert len(host) < 4 or host not in json.dumps(env), "the record names the host"


def test_git_commit_outside_a_checkout_says_why(tmp_path):
    assert git_commit(tmp_path) == "unknown (CalledProcessError)"


def test_peaks_by_device_name():
    assert peaks("NVIDIA H200") == (1979.0, 989.0, 4800.0)
    assert peaks("NVIDIA H200 NVL") == (1671.0, 835.0, 4800.0)  # the NVL part first: "H200" is in its name too
    assert peaks("cpu") == CPU_PEAKS and peaks("NVIDIA A10") is None


def _sleeper(seconds: float, calls: list):
    def fn() -> None:
        calls.append(1)
        time.sleep(seconds)

    return fn


def test_cpu_wall_clock_takes_up_to_three_calls_within_rep_ms():
    timer = Timer(torch, torch.device("cpu"), warmup_ms=1, rep_ms=1000)
    calls: list = []
    ms = timer.eager_ms(_sleeper(0.005, calls))
    assert len(calls) == CPU_CALLS == 3 and 5.0 <= ms < 500.0
    slow = Timer(torch, torch.device("cpu"), warmup_ms=1, rep_ms=1)
    calls = []
    assert slow.eager_ms(_sleeper(0.01, calls)) >= 10.0 and len(calls) == 1  # past rep_ms after one call: one figure
    calls = []
    assert slow.host_us(_sleeper(0.001, calls)) >= 1000.0 and len(calls) == 2

