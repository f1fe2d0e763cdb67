"""The source-file digest --resume relies on (scheme sha256-tree-64MiB, quantkit/converters/provenance.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from quantkit.converters.provenance import FILE_HASH, TreeHasher

MIB64 = 64 * 2**20


def tree_sha256(data: bytes) -> str:
    """The scheme written out: sha256 of each 64 MiB piece, then sha256 of those 32-byte digests + 64 MiB as u64 LE."""
    leaves = [hashlib.sha256(data[a : a + MIB64]).digest() for a in range(0, len(data), MIB64)]
    return hashlib.sha256(b"".join(leaves) + MIB64.to_bytes(8, "little")).hexdigest()


def digest(path: Path, data: bytes, threads: int = 3) -> str:
    path.write_bytes(data)
    hasher = TreeHasher(threads)
    try:
        return hasher.digest(path)
    finally:
        hasher.close()


def test_the_scheme_is_named() -> None:
    assert FILE_HASH == "sha256-tree-64MiB"


@pytest.mark.parametrize("data, want", [
    (b"", "525c3368aba80a606f181bd81ae58ae0cff8a52d05b47ddc01c0c3d1273397e4"),  # no leaves
    (b"abc", "eb3f2eaea7870bf693925dd668ad68b22ca1d50f9bc3dc4ef6636852bcf49dc0"),  # one short leaf
])
def test_golden_digests_of_tiny_files(tmp_path: Path, data: bytes, want: str) -> None:
    assert digest(tmp_path / "f", data) == want == tree_sha256(data)


def test_digest_of_a_large_file_and_one_byte_changed(tmp_path: Path) -> None:
    """Two full leaves and a short last one; any changed byte (first leaf, last short leaf) changes the digest."""
    data = bytearray(hashlib.shake_256(b"quantkit").digest(2 * MIB64 + 4097))
    base = tree_sha256(bytes(data))
    assert digest(tmp_path / "f", bytes(data)) == base
    assert digest(tmp_path / "f", bytes(data), threads=1) == base
    assert digest(tmp_path / "f", bytes(data[: 2 * MIB64])) == tree_sha256(bytes(data[: 2 * MIB64]))  # no short leaf
    seen = {base}
    for pos in (0, MIB64 - 1, 2 * MIB64, len(data) - 1):
        data[pos] ^= 0x01
        got = digest(tmp_path / "f", bytes(data))
        assert got == tree_sha256(bytes(data)) and got not in seen, pos
        seen.add(got)
        data[pos] ^= 0x01
    assert digest(tmp_path / "f", bytes(data)) == base
    assert digest(tmp_path / "f", bytes(data[:-1])) not in seen  # one byte shorter
