"""Small modules with one job each: no library source file passes 600 lines (issue #40's
bound, set when the study catalogue was split into one module per study family)."""

from __future__ import annotations

from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src" / "turnrl"
MAX_LINES = 600


def test_no_source_file_passes_600_lines() -> None:
    sizes = {
        str(path.relative_to(SOURCE)): len(path.read_text().splitlines())
        for path in sorted(SOURCE.rglob("*.py"))
    }
    assert len(sizes) > 100  # the package is where this test looks
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
