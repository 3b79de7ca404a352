"""Doc markers: which study writes which table of a markdown document.

A study's table sits between ``<!-- study:NAME:TABLE -->`` and
``<!-- /study:NAME:TABLE -->``; ``turnrl study summarise NAME`` replaces what is
between them. A table that no study writes (a configuration reference, a list of
options) is preceded by ``<!-- table:reference -->``, so the exemption is visible
in the document itself. :func:`unmarked_tables` finds every table that is neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from turnrl.errors import InputError

BEGIN = re.compile(r"<!-- study:([A-Za-z0-9_.-]+):([A-Za-z0-9_.-]+) -->")
END = re.compile(r"<!-- /study:([A-Za-z0-9_.-]+):([A-Za-z0-9_.-]+) -->")
REFERENCE = "<!-- table:reference -->"
SEPARATOR = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


def begin(study: str, table: str) -> str:
    return f"<!-- study:{study}:{table} -->"


def end(study: str, table: str) -> str:
    return f"<!-- /study:{study}:{table} -->"


@dataclass(frozen=True)
class Block:
    study: str
    table: str
    first: int
    """0-based line of the opening marker."""
    last: int
    """0-based line of the closing marker."""


@dataclass(frozen=True)
class DocTable:
    path: Path
    line: int
    """1-based line of the table's header row."""
    study: str | None
    table: str | None
    reference: bool


def blocks(path: Path, lines: list[str]) -> list[Block]:
    """The marker blocks of a document; an unclosed or mismatched marker is an error
    naming the file and line."""
    out, opened = [], None
    for index, line in enumerate(lines):
        if match := BEGIN.search(line):
            if opened is not None:
                raise InputError(
                    f"{path}:{index + 1}: marker opened inside {opened[1]}:{opened[2]}"
                )
            opened = (index, match.group(1), match.group(2))
        elif match := END.search(line):
            if opened is None or (match.group(1), match.group(2)) != opened[1:]:
                raise InputError(
                    str(path), index + 1, None, "closing marker without its opening marker"
                )
            out.append(Block(opened[1], opened[2], opened[0], index))
            opened = None
    if opened is not None:
        raise InputError(
            str(path), opened[0] + 1, None, f"marker {opened[1]}:{opened[2]} never closed"
        )
    return out


def tables(path: Path) -> list[DocTable]:
    """Every markdown table of a document (outside fenced code), with the block it is in
    and whether a ``table:reference`` marker precedes it."""
    lines = path.read_text().splitlines()
    spans = blocks(path, lines)
    out, fenced = [], False
    for index, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced or index == 0 or not SEPARATOR.match(line) or "|" not in lines[index - 1]:
            continue
        header = index - 1
        block = next((b for b in spans if b.first < header < b.last), None)
        previous = _comments_before(lines, header)
        out.append(
            DocTable(
                path,
                header + 1,
                block.study if block else None,
                block.table if block else None,
                REFERENCE in previous,
            )
        )
    return out


def _comments_before(lines: list[str], index: int) -> list[str]:
    """The HTML comment lines right above line ``index`` (blank lines skipped)."""
    out = []
    for line in reversed(lines[:index]):
        text = line.strip()
        if not text:
            continue
        if not (text.startswith("<!--") and text.endswith("-->")):
            break
        out.append(text)
    return out


def present(path: Path, study: str, names: list[str]) -> list[str]:
    """Which of ``names`` have a marker block of ``study`` in the document, in the
    document's order."""
    found = [b.table for b in blocks(path, path.read_text().splitlines()) if b.study == study]
    return [name for name in found if name in names]


def replace_block(path: Path, study: str, table: str, content: str) -> bool:
    """Put ``content`` between the study's markers; ``False`` when the doc has none."""
    from turnrl.io import atomic_write_text

    text = path.read_text()
    lines = text.splitlines()
    block = next((b for b in blocks(path, lines) if (b.study, b.table) == (study, table)), None)
    if block is None:
        return False
    new = lines[: block.first + 1] + content.strip("\n").splitlines() + lines[block.last :]
    atomic_write_text(path, "\n".join(new) + ("\n" if text.endswith("\n") else ""))
    return True


def problems(paths: list[Path], known: dict[str, tuple[str, ...]]) -> list[str]:
    """Every table of ``paths`` that no declared study or measurement writes and that is
    not marked as a reference table, and every marker naming an unknown study or table:
    one line each, ``file:line: what``."""
    out = []
    for path in paths:
        for block in blocks(path, path.read_text().splitlines()):
            if block.table not in known.get(block.study, ()):
                out.append(
                    f"{path}:{block.first + 1}: marker names {block.study}:{block.table}, "
                    "which no declared study or measurement writes"
                )
        for table in tables(path):
            if table.study is None and not table.reference:
                out.append(
                    f"{path}:{table.line}: table outside any study marker and not marked "
                    f"{REFERENCE}"
                )
    return out
