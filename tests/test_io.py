"""Atomic writes and crash-tolerant JSONL appends."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from turnrl.errors import OutputError
from turnrl.io import (
    append_jsonl,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    check_output_path,
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


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path: Path) -> None:
    target = tmp_path / "real.jsonl"
    target.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    atomic_write_text(link, "new\n")
    assert link.is_symlink()
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.jsonl", "real.jsonl"]


@pytest.mark.parametrize("special", ["/dev/null", "directory"])
def test_a_target_that_is_not_a_regular_file_is_refused(tmp_path: Path, special: str) -> None:
    path = Path(special) if special.startswith("/") else tmp_path
    with pytest.raises(OutputError, match="refusing to replace it"):
        atomic_write_text(path, "x")
    assert path.exists()
    if path == tmp_path:
        assert list(tmp_path.iterdir()) == []  # no temporary file left behind


def test_new_files_honour_the_umask_and_old_files_keep_their_mode(tmp_path: Path) -> None:
    previous = os.umask(0o027)
    try:
        fresh = atomic_write_text(tmp_path / "fresh.txt", "a")
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o640
        os.umask(0o022)
        again = atomic_write_text(tmp_path / "again.txt", "a")
        assert stat.S_IMODE(again.stat().st_mode) == 0o644
        again.chmod(0o600)
        atomic_write_text(again, "b")
        assert stat.S_IMODE(again.stat().st_mode) == 0o600
    finally:
        os.umask(previous)


def test_a_file_the_directory_refuses_is_an_output_error(tmp_path: Path, monkeypatch) -> None:
    import turnrl.io as io

    def denied(**kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(io.tempfile, "mkstemp", denied)
    with pytest.raises(OutputError, match=r"out\.json: cannot write here \(Permission denied\)"):
        atomic_write_text(tmp_path / "out.json", "x")
    with pytest.raises(OutputError, match=r"-o .*out\.json: cannot create a file in .*Permission"):
        check_output_path(tmp_path / "out.json", option="-o")
    assert list(tmp_path.iterdir()) == []


def test_check_output_path_accepts_a_new_file_and_leaves_nothing(tmp_path: Path) -> None:
    assert check_output_path(tmp_path / "new.jsonl") == tmp_path / "new.jsonl"
    with pytest.raises(OutputError, match=r"the directory .*missing does not exist"):
        check_output_path(tmp_path / "missing" / "new.jsonl")
    assert list(tmp_path.iterdir()) == []
