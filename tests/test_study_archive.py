"""The committed archive of a study's finished cells (``turnrl.study.archive``): what it
keeps, that restoring it summarises to the same tables, that a rerun of the missing
cells is summarised together with the kept ones, and its errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from test_study_tables import finish, two_arm_study
from turnrl.errors import InputError
from turnrl.study.archive import archive_path, read_archive, read_keys, restore, write_archive
from turnrl.study.declaration import DONE_FILE, cells
from turnrl.study.runner import FINISHED, PARTIAL, cell_state, read_metrics
from turnrl.study.summary import summarise

DOC = "<!-- study:toy:arms -->\n<!-- /study:toy:arms -->\n"


def summarised(root: Path) -> str:
    """The doc's text after a summary, less the provenance line that records when the
    summary was made (two summaries a minute apart differ there, by design)."""
    (root / "doc.md").write_text(DOC)
    summarise(two_arm_study(root), root, "summarise toy")
    lines = (root / "doc.md").read_text().splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("- summary: `"))


def test_the_archive_keeps_only_the_keys_the_tables_and_figure_read(tmp_path: Path) -> None:
    study = two_arm_study(tmp_path)
    finish(study, tmp_path)
    first = cells(study, tmp_path)[0]
    extra_rows = [{"step": 3, "loss": 1.5}, {"step": 4, "loss": 1.0, "eval_success": 0.5}]
    with (first.run_dir / "metrics.jsonl").open("a") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in extra_rows))
    assert read_keys(study) == {"eval_success", "step"}
    write_archive(study, tmp_path)
    kept = read_archive(study, tmp_path)
    assert list(kept) == [c.key for c in cells(study, tmp_path)]
    # the row with only an unread key is dropped, the unread key of the other cut away
    assert kept[first.key]["rows"] == [
        {"step": 0, "eval_success": 0.25},
        {"step": 1, "eval_success": 0.125},
        {"step": 2, "eval_success": 0.5},
        {"step": 4, "eval_success": 0.5},
    ]
    assert kept[first.key]["record"] == {"seconds": 60.0}


def test_restored_cells_summarise_to_the_same_tables(tmp_path: Path) -> None:
    finish(two_arm_study(tmp_path), tmp_path)
    before = summarised(tmp_path)
    assert archive_path(two_arm_study(tmp_path), tmp_path).exists()
    shutil.rmtree(tmp_path / "runs")  # the machine is lost; the archive is committed
    archived = archive_path(two_arm_study(tmp_path), tmp_path).read_bytes()
    study = two_arm_study(tmp_path)
    restored = restore(study, tmp_path)
    assert [c.key for c in restored] == [c.key for c in cells(study, tmp_path)]
    assert all(cell_state(c) == FINISHED for c in cells(study, tmp_path))
    record = json.loads((restored[0].run_dir / DONE_FILE).read_text())
    assert record == {"seconds": 60.0, "restored_from": "studies/toy.cells.jsonl"}
    assert summarised(tmp_path) == before
    # summarising restored cells leaves their archived lines as they were
    assert archive_path(study, tmp_path).read_bytes() == archived


def test_a_rerun_of_the_missing_cells_is_summarised_with_the_kept_ones(tmp_path: Path) -> None:
    """Archive all six, lose the run directories, find a partial run of the sixth here:
    the other five are restored, the sixth is left alone, and once it finishes (here
    written by hand, with another end value) the tables and the archive hold all six,
    the sixth with its new value."""
    study = two_arm_study(tmp_path)
    finish(study, tmp_path)
    write_archive(study, tmp_path)
    shutil.rmtree(tmp_path / "runs")
    last = cells(study, tmp_path)[-1]  # new/seed2
    last.run_dir.mkdir(parents=True)
    (last.run_dir / "config.toml").write_text("")  # a partial run of it is here
    restored = restore(study, tmp_path)
    assert len(restored) == 5 and cell_state(last) == PARTIAL  # a run here is left alone
    rows = [{"step": 0, "eval_success": 0.25}, {"step": 2, "eval_success": 0.75}]
    (last.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (last.run_dir / DONE_FILE).write_text(json.dumps({"seconds": 30.0}))
    text = summarised(tmp_path)
    assert "6 of 6 declared cells finished" in text
    assert "| new | 3 | 0.25 | 0.72 ± 0.06 | +0.47 ± 0.06 | 0.75, 0.65, 0.75 |" in text
    kept = read_archive(study, tmp_path)
    assert len(kept) == 6 and kept[last.key]["rows"][-1] == {"step": 2, "eval_success": 0.75}


def test_archiving_a_partial_rerun_never_drops_archived_cells(tmp_path: Path) -> None:
    study = two_arm_study(tmp_path)
    finish(study, tmp_path)
    write_archive(study, tmp_path)
    for cell in cells(study, tmp_path)[1:]:
        shutil.rmtree(cell.run_dir)
    write_archive(study, tmp_path)
    assert len(read_archive(study, tmp_path)) == 6
    assert [len(read_metrics(c)) for c in cells(study, tmp_path)] == [3, 0, 0, 0, 0, 0]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "studies/toy.cells.jsonl:2: not JSON"),
        ('{"cell": "base/seed1", "record": {}, "rows": {}}', "2: field 'rows': must be a list"),
        ('{"record": {}, "rows": []}', "2: field 'cell': must be a str"),
    ],
)
def test_a_malformed_archive_line_names_file_line_and_field(
    tmp_path: Path, line: str, message: str
) -> None:
    study = two_arm_study(tmp_path)
    path = archive_path(study, tmp_path)
    path.parent.mkdir()
    path.write_text('{"cell": "base/seed0", "record": {}, "rows": []}\n' + line + "\n")
    with pytest.raises(InputError, match=message):
        restore(study, tmp_path)
