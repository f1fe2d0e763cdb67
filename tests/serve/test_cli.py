"""``quantkit serve`` as a command: starts, answers, stops on SIGINT; bad input is one clear error."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request

from click.testing import CliRunner

from quantkit.cli import main


def test_serve_starts_answers_and_stops(ckpt):
    p = subprocess.Popen([sys.executable, "-m", "quantkit", "serve", str(ckpt("qwen3")), "--port", "0", "--device", "cpu",
                          "--max-model-len", "128", "--kv-cache-gib", "0.01", "--served-model-name", "tiny", "--api-key", "k1"],
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stderr.readline()
        m = re.search(r"serving tiny on (http://\S+) ", line)
        assert m, line
        url = m.group(1)
        req = urllib.request.Request(url + "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2, "ignore_eos": True}).encode(),
                                     headers={"Authorization": "Bearer k1"})
        with urllib.request.urlopen(req, timeout=60) as r:
            body = json.loads(r.read())
        assert body["model"] == "tiny" and body["usage"]["completion_tokens"] == 2
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
        p.stderr.close()


def test_not_a_checkpoint(tmp_path):
    r = CliRunner().invoke(main, ["serve", str(tmp_path), "--device", "cpu"])
    assert r.exit_code == 1 and f"{tmp_path}: no *.safetensors files" in r.output


def test_port_in_use(ckpt):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = CliRunner().invoke(main, ["serve", str(ckpt("qwen3")), "--device", "cpu", "--port", str(port), "--kv-cache-gib", "0.01"])
    assert r.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in r.output


def test_cache_smaller_than_the_context_is_refused(ckpt):
    r = CliRunner().invoke(main, ["serve", str(ckpt("qwen3")), "--device", "cpu", "--kv-cache-gib", "0.000001", "--port", "0"])
    assert r.exit_code == 1 and "less than max_model_len" in r.output


def test_one_rank_of_a_sharded_checkpoint_is_refused(ckpt, tmp_path):
    """A rank directory holds half of the experts at EP 2: served alone it would be a different model."""
    from quantkit.shard import shard

    shard(ckpt("qwen3-moe"), tmp_path / "ep2", ep=2)
    rank = tmp_path / "ep2" / "rank-00001-of-00002"
    r = CliRunner().invoke(main, ["serve", str(rank), "--device", "cpu", "--port", "0"])
    assert r.exit_code == 1 and "rank 1 of a 2-rank checkpoint written by `quantkit shard`" in r.output


def test_without_the_serve_extra_the_command_says_what_to_install(ckpt, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn now fails as it does where it is not installed
    r = CliRunner().invoke(main, ["serve", str(ckpt("qwen3")), "--device", "cpu", "--port", "0"])
    assert r.exit_code == 1 and "`quantkit serve` needs uvicorn, which is not installed: pip install 'quantkit[serve]'" in r.output


def test_an_http_package_that_cannot_import_fails_the_command_not_its_clients(ckpt, monkeypatch):
    """fastapi 0.165 installed without its opentelemetry-api: the command says so before loading or listening (the
    server used to bind, then die at its first import of fastapi, and clients saw connections reset)."""
    import importlib

    real = importlib.import_module

    def broken(name, *a):
        if name == "fastapi":
            raise ModuleNotFoundError("No module named 'opentelemetry'", name="opentelemetry")
        return real(name, *a)

    def build(*a, **k):
        raise AssertionError("the model was loaded and a socket bound before the check")

    from quantkit.serve import launch

    monkeypatch.setattr(importlib, "import_module", broken)
    monkeypatch.setattr(launch, "build", build)
    r = CliRunner().invoke(main, ["serve", str(ckpt("qwen3")), "--device", "cpu", "--port", "0"])
    assert r.exit_code == 1 and "needs fastapi, which does not import (No module named 'opentelemetry')" in r.output, r.output
