"""``turnrl study summarise``: the tables, the figure, the provenance, the doc markers.

Writes ``runs/studies/<study>/summary.md`` (every table, the notes under them and
the provenance block), the figure to ``docs/img/study-<study>.png`` when the study
declares a curve, and each table between its markers in the study's doc, followed
by the provenance. Only finished cells are summarised; the summary says how many of
the declared cells that is. Every finished cell is also kept in the study's archive
(``turnrl.study.archive``: committed, so that a lost run directory can be restored).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from turnrl.errors import UsageError
from turnrl.io import atomic_write_text
from turnrl.study import archive, markers, provenance, tables
from turnrl.study.declaration import Study, cells, study_dir
from turnrl.study.figures import plot_curves
from turnrl.study.runner import FINISHED, cell_record, cell_state, read_metrics


@dataclass
class Summary:
    text: str
    path: Path
    figure: Path | None
    doc_tables: list[str]
    """Marker names filled in the doc."""
    archive: Path


def run_command(study: Study) -> str:
    return f"turnrl study run {study.name}"


def summarise(study: Study, root: Path, summary_command: str | None = None) -> Summary:
    every = [c for c in cells(study, root) if not c.is_warm_start]
    finished = [c for c in every if cell_state(c) == FINISHED]
    if not finished:
        raise UsageError(
            f"study {study.name!r}: no finished cell under {study_dir(study, root)}; "
            f"run `{run_command(study)}` first"
        )
    cache: dict[Path, list[dict]] = {}

    def rows(cell) -> list[dict]:
        if cell.run_dir not in cache:
            cache[cell.run_dir] = read_metrics(cell)
        return cache[cell.run_dir]

    coverage = f"{len(finished)} of {len(every)} declared cells finished"
    if len(finished) < len(every):
        missing = sorted({c.key for c in every} - {c.key for c in finished})
        coverage += " (missing: " + ", ".join(missing) + ")"
    prov = provenance.block(
        root,
        run_command(study),
        summary_command or f"turnrl study summarise {study.name}",
        [cell_record(c) for c in finished],
    )
    built = {t.name: tables.build(study, t, finished, rows) for t in study.tables}
    figure = plot_curves(study, finished, rows, root / "docs" / "img" / f"study-{study.name}.png")
    parts = [f"# {study.title}", "", coverage + ".", ""]
    for name, text in built.items():
        parts += [f"## {name}", "", text, ""]
    parts += ["## provenance", "", prov, ""]
    text = "\n".join(parts)
    path = study_dir(study, root) / "summary.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    filled = []
    if study.doc:
        doc = root / study.doc
        present = markers.present(doc, study.name, list(built))
        for name in present:
            block = f"{built[name]}\n\n{coverage}; `{run_command(study)}`, then "
            block += f"`turnrl study summarise {study.name}`."
            if name == present[-1]:  # the provenance once, under the doc's last table
                block += f"\n\n<details><summary>provenance</summary>\n\n{prov}\n\n</details>"
            markers.replace_block(doc, study.name, name, block)
            filled.append(name)
    return Summary(text, path, figure, filled, archive.write_archive(study, root))
