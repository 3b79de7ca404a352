"""Atomic writes and crash-tolerant JSONL appends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turnrl.io import (
    append_jsonl,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_jsonl_tolerant,
)


def test_atomic_writes_replace_and_leave_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "a.txt"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two ü")
    assert target.read_text(encoding="utf-8") == "two ü"
    atomic_write_bytes(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    atomic_write_json(tmp_path / "c.json", {"x": [1, 2]})
    assert json.loads((tmp_path / "c.json").read_text()) == {"x": [1, 2]}
    leftovers = [p.name for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


def test_failed_write_keeps_old_file(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    atomic_write_json(target, {"ok": 1})
    with pytest.raises(TypeError):
        atomic_write_json(target, {"bad": object()})
    assert json.loads(target.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_append_and_read_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    for step in range(3):
        append_jsonl(path, {"step": step, "text": "a\nb"})
    assert read_jsonl_tolerant(path) == [{"step": s, "text": "a\nb"} for s in range(3)]


def test_partial_last_line_is_skipped_then_repaired(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    append_jsonl(path, {"step": 0})
    with open(path, "ab") as handle:
        handle.write(b'{"step": 1, "lo')  # crash mid-append
    assert read_jsonl_tolerant(path) == [{"step": 0}]
    append_jsonl(path, {"step": 2})
    assert read_jsonl_tolerant(path) == [{"step": 0}, {"step": 2}]


def test_partial_only_line_is_repaired(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"st')
    assert read_jsonl_tolerant(path) == []
    append_jsonl(path, {"step": 0})
    assert path.read_bytes() == b'{"step": 0}\n'


def test_corruption_in_the_middle_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 0}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"m\.jsonl:2: corrupt JSON line"):
        read_jsonl_tolerant(path)


def test_terminated_bad_last_line_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 0}\n{"step": \n')
    with pytest.raises(ValueError, match=":2:"):
        read_jsonl_tolerant(path)
