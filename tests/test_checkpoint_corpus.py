"""Malformed safetensors headers, indexes and config files, made from a tiny synth checkpoint: every
command that reads them (inspect, convert, shard, and the engine loader behind serve and eval)
stops with one line naming the file and the rule, a non-zero exit, and no output left behind."""

from __future__ import annotations

import json
import re
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from quantkit.checkpoint import INDEX, CheckpointError
from quantkit.cli import main
from quantkit.synth import synthesize

SHARD = "model-00001-of-00005.safetensors"
OTHER = "model-00002-of-00005.safetensors"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("corpus") / "qwen3"
    synthesize("qwen3", d, preset="tiny", max_shard_size="1MB")
    assert sorted(p.name for p in d.glob("*.safetensors"))[:2] == [SHARD, OTHER]
    return d


def _split(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _header_bytes(path: Path, header: bytes) -> None:
    """Replace the header of ``path`` by ``header`` (raw JSON text), keeping its data bytes."""
    _, data = _split(path)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def _header(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        h, _ = _split(d / SHARD)
        _header_bytes(d / SHARD, json.dumps(edit(h)).encode())
    return apply


def _entry(field: str, value: object) -> Callable[[Path], None]:
    def edit(h: dict) -> dict:
        name = next(k for k in h if k != "__metadata__")
        h[name] = {**h[name], field: value} if value is not None else {k: v for k, v in h[name].items() if k != field}
        return h
    return _header(edit)


def _json_file(name: str, text: str) -> Callable[[Path], None]:
    return lambda d: (d / name).write_text(text)


def _weight_map(value: Callable[[dict], object]) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        idx = json.loads((d / INDEX).read_text())
        idx["weight_map"] = value(idx["weight_map"])
        (d / INDEX).write_text(json.dumps(idx))
    return apply


def _twice(d: Path) -> None:
    """One tensor of the first shard also stored in the second (the index names the first)."""
    first, second = load_file(d / SHARD), load_file(d / OTHER)
    name = sorted(first)[0]
    save_file({**second, name: first[name]}, d / OTHER, metadata={"format": "pt"})


def _repeated_key(d: Path) -> None:
    h, _ = _split(d / SHARD)
    name = next(k for k in h if k != "__metadata__")
    text = json.dumps(h)
    entry = json.dumps({name: h[name]})[1:-1]
    _header_bytes(d / SHARD, (text[:-1] + ", " + entry + "}").encode())


# (case id, corruption, file the message names, the rule it states)
CASES = [
    ("header-list", _header(lambda h: [h]), SHARD, "header must be a JSON object, not list"),
    ("header-number", _header(lambda h: 3), SHARD, "header must be a JSON object, not int"),
    ("header-null", _header(lambda h: None), SHARD, "header must be a JSON object, not NoneType"),
    ("header-repeated-key", _repeated_key, SHARD, "header is not valid JSON .key .* appears twice"),
    ("entry-string", _header(lambda h: {**h, "x": "F32"}), SHARD, "tensor 'x' entry must be an object"),
    ("entry-no-offsets", _entry("data_offsets", None), SHARD, "has no data_offsets"),
    ("entry-no-shape", _entry("shape", None), SHARD, "has no shape"),
    ("offsets-strings", _entry("data_offsets", ["0", "8"]), SHARD, r"data_offsets \['0', '8'\] must be \[begin, end\]"),
    ("offsets-reversed", _entry("data_offsets", [8, 0]), SHARD, r"must be \[begin, end\], integers with 0 <= begin <= end"),
    ("shape-float", _entry("shape", [2048.0, 256]), SHARD, r"shape \[2048.0, 256\] must be a list of non-negative integers"),
    ("shape-negative", _entry("shape", [-2048, -256]), SHARD, "must be a list of non-negative integers"),
    ("shape-bool", _entry("shape", [True]), SHARD, "must be a list of non-negative integers"),
    ("shape-string", _entry("shape", "2048x256"), SHARD, "must be a list of non-negative integers"),
    ("dtype-number", _entry("dtype", 7), SHARD, "unknown dtype 7"),
    ("metadata-int", _header(lambda h: {**h, "__metadata__": {"format": 1}}), SHARD, "__metadata__ value of 'format' is int"),
    ("metadata-list", _header(lambda h: {**h, "__metadata__": ["pt"]}), SHARD, "__metadata__ must be an object of strings, not list"),
    ("index-list", _json_file(INDEX, "[]"), INDEX, "the index must be a JSON object, not list"),
    ("index-not-json", _json_file(INDEX, "{"), INDEX, "the index is not valid JSON"),
    ("index-no-map", _json_file(INDEX, "{}"), INDEX, "weight_map must be an object"),
    ("index-map-list", _weight_map(lambda m: list(m)), INDEX, "weight_map must be an object .* got list"),
    ("index-int-values", _weight_map(lambda m: dict.fromkeys(m, 1)), INDEX, "weight_map.* is 1; it must be a file name"),
    ("config-list", _json_file("config.json", "[]"), "config.json", "the file must be a JSON object, not list"),
    ("config-not-json", _json_file("config.json", "{'a': 1}"), "config.json", "the file is not valid JSON"),
    ("tensor-in-two-shards", _twice, OTHER, f"is also in {SHARD}: a tensor name may be in one shard only"),
]


@pytest.fixture(params=CASES, ids=[c[0] for c in CASES])
def broken(request: pytest.FixtureRequest, base: Path, tmp_path: Path) -> tuple[Path, str, str]:
    _, corrupt, fname, rule = request.param
    d = tmp_path / "src"
    shutil.copytree(base, d)
    corrupt(d)
    return d, fname, rule


def _one_line_error(args: list[str], fname: str, rule: str) -> None:
    res = CliRunner().invoke(main, args)
    lines = res.output.strip().splitlines()
    assert res.exit_code != 0 and "Traceback" not in res.output, res.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert fname in lines[0], lines[0]
    assert re.search(rule, lines[0]), lines[0]


def test_every_command_refuses_with_one_line(broken: tuple[Path, str, str], tmp_path: Path) -> None:
    src, fname, rule = broken
    _one_line_error(["inspect", str(src)], fname, rule)
    for cmd in (["convert", str(src), str(tmp_path / "fp8"), "--to", "fp8-block"], ["shard", str(src), str(tmp_path / "ep2"), "--ep", "2"]):
        _one_line_error(cmd, fname, rule)
        dst = Path(cmd[2])
        assert not dst.exists() and not (dst.parent / f".{dst.name}.quantkit-partial").exists()


def test_engine_loader_refuses(broken: tuple[Path, str, str]) -> None:
    """serve and eval load through the engine loader: the same error, before any model is built."""
    from quantkit.engine.loader import load

    src, fname, rule = broken
    with pytest.raises(CheckpointError, match=rule) as e:
        load(src)
    assert fname in str(e.value) and "\n" not in str(e.value)
