#!/usr/bin/env python
"""Characters of prose (comments and docstrings) against code, per package of quantkit.

    python scripts/prose.py [--files] [PATH ...]        # default: every package under quantkit/

A comment is the text of a ``#`` token; a docstring is the first string statement of a module, class or function.
Prose characters are theirs, stripped of the markers and leading spaces; code characters are the rest of each file's
non-blank characters.  Prints one row per package (its .py files, not its subpackages'), or per file with ``--files``,
and the totals.
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def prose_chars(src: str) -> tuple[int, int]:
    """(prose characters, all non-blank characters) of one Python source."""
    comments = sum(len(t.string.lstrip("#").strip()) for t in tokenize.generate_tokens(io.StringIO(src).readline) if t.type == tokenize.COMMENT)
    docs = 0
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            d = ast.get_docstring(node, clean=True)
            docs += sum(len(ln.strip()) for ln in d.splitlines()) if d else 0
    return comments + docs, sum(len(ln.strip()) for ln in src.splitlines())


def _name(p: Path) -> str:
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def packages(paths: list[Path], per_file: bool = False) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for p in paths:
        files = [p] if p.is_file() else sorted(p.rglob("*.py"))
        for f in files:
            out.setdefault(_name(f if per_file else f.parent), []).append(f)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", type=Path, default=[ROOT / "quantkit"])
    p.add_argument("--files", action="store_true", help="one row per file instead of per package")
    a = p.parse_args()
    rows, tp, ta = [], 0, 0
    for pkg, files in sorted(packages([x.resolve() for x in a.paths], a.files).items()):
        pr, al = map(sum, zip(*(prose_chars(f.read_text()) for f in files)))
        rows.append((pkg, len(files), pr, al))
        tp, ta = tp + pr, ta + al
    print("| package | files | prose chars | all chars | prose share |\n|---|---|---|---|---|")
    for pkg, n, pr, al in rows:
        print(f"| {pkg} | {n} | {pr} | {al} | {pr / max(al, 1):.0%} |")
    print(f"| total | {sum(r[1] for r in rows)} | {tp} | {ta} | {tp / max(ta, 1):.0%} |")


if __name__ == "__main__":
    main()
