"""The tables ``turnrl study summarise`` writes, the doc markers, and the rule that
every table of the docs names the study (or measurement) that writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turnrl.errors import InputError, UsageError
from turnrl.study import markers, provenance
from turnrl.study.catalogue import STUDIES, known_tables
from turnrl.study.declaration import Arm, Metric, Study, Table, cells
from turnrl.study.runner import read_metrics
from turnrl.study.summary import summarise
from turnrl.study.tables import build
from turnrl.study.values import reduce

ROOT = Path(__file__).resolve().parents[1]
SUCCESS = Metric("eval_success", "success")


def two_arm_study(root: Path) -> Study:
    (root / "recipe.toml").write_text("")
    return Study(
        name="toy",
        title="toy",
        config="recipe.toml",
        arms=(Arm("base"), Arm("new")),
        seeds=(0, 1, 2),
        baseline="base",
        doc="doc.md",
        curve="eval_success",
        tables=(
            Table(
                "seeds",
                "seeds",
                (SUCCESS,),
                extra=(Metric("eval_success", "low", "min_after_first"),),
            ),
            Table("arms", "arms", (SUCCESS,)),
            Table("paired", "paired", (SUCCESS,)),
        ),
    )


END = {"base": [0.5, 0.6, 0.7], "new": [0.75, 0.65, 1.0]}


def finish(study: Study, root: Path) -> None:
    """Hand-written runs: start 0.25, a dip to 0.125, then the END value."""
    for cell in cells(study, root):
        cell.run_dir.mkdir(parents=True)
        rows = [
            {"step": 0, "eval_success": 0.25},
            {"step": 1, "eval_success": 0.125},
            {"step": 2, "eval_success": END[cell.arm][cell.seed]},
        ]
        (cell.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (cell.run_dir / "study-cell.json").write_text(json.dumps({"seconds": 60.0}))


def test_seed_arm_and_paired_tables(tmp_path: Path) -> None:
    study = two_arm_study(tmp_path)
    finish(study, tmp_path)
    done = cells(study, tmp_path)
    seeds, arms, paired = (build(study, t, done, read_metrics) for t in study.tables)
    assert seeds.splitlines()[:4] == [
        "| arm | seed | success start → end | low |",
        "|---|---|---:|---:|",
        "| base | 0 | 0.25 → 0.50 | 0.12 |",
        "| base | 1 | 0.25 → 0.60 | 0.12 |",
    ]
    # end of new: 0.8 ± sd(0.75, 0.65, 1.0) = 0.18 (ddof = 1; ddof = 0 would be 0.15)
    assert (
        arms.splitlines()[3] == "| new | 3 | 0.25 | 0.80 ± 0.18 | +0.55 ± 0.18 | 0.75, 0.65, 1.00 |"
    )
    row = paired.splitlines()[2]
    # differences +0.25, +0.05, +0.30: mean 0.2, sd sqrt(0.0175), t = 2.619 on 2 df
    assert row.startswith(
        "| new − base | success | 3 seeds | +0.25, +0.05, +0.30 | +0.20 | [-0.13, +0.53] "
        "| 0.120 | 0.250 | not detected (n = 3 seeds; paired t p = 0.120; sign-flip p = 0.250 "
        "(cannot reach 0.05 at n = 3: smallest p 0.25)) |"
    )
    assert "ddof = 1" in arms and "paired t-interval" in paired and "bootstrap" not in paired


def test_pairs_are_formed_by_seed_not_by_position(tmp_path: Path) -> None:
    """#38's planted bug: with seed 1 of ``new`` missing, pairing by position would set
    new's seed 2 (1.0) against base's seed 1 (0.6). By seed, seed 1 drops out."""
    study = two_arm_study(tmp_path)
    finish(study, tmp_path)
    done = [c for c in cells(study, tmp_path) if not (c.arm == "new" and c.seed == 1)]
    paired = build(study, study.tables[2], done, read_metrics)
    assert "| new − base | success | 2 seeds | +0.25, +0.30 | +0.28 |" in paired


def test_a_whole_run_mean_counts_every_row_that_has_the_key(tmp_path: Path) -> None:
    """``reduce="mean"``: the mean over every row that logged the key (the evaluation
    row of step 0 has none), shown per arm as mean ± sd and per seed."""
    study = two_arm_study(tmp_path)
    returns = {0: [0.1, 0.2, 0.6], 1: [0.0, 0.0, 0.3], 2: [0.5, 0.5, 0.5]}
    for cell in cells(study, tmp_path):
        cell.run_dir.mkdir(parents=True)
        rows = [{"step": 0, "eval_success": 0.25}] + [
            {"step": step, "return": value}
            for step, value in enumerate(returns[cell.seed], start=1)
        ]
        (cell.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    deployed = Metric("return", "deployed", "mean")
    done = [c for c in cells(study, tmp_path) if c.arm == "base"]
    assert [reduce(read_metrics(c), deployed) for c in done] == pytest.approx([0.3, 0.1, 0.5])
    table = build(study, Table("arms", "arms", (deployed,)), done, read_metrics)
    # mean 0.3, sd of (0.3, 0.1, 0.5) = 0.2 (ddof = 1)
    assert table.splitlines()[:3] == [
        "| arm | n | deployed (mean ± sd) | per seed |",
        "|---|---|---:|---:|",
        "| base | 3 | 0.30 ± 0.20 | 0.30, 0.10, 0.50 |",
    ]


def test_a_window_mean_smooths_start_and_end(tmp_path: Path) -> None:
    """``reduce="last:2"``: the end is the mean of the last 2 rows that logged the key,
    the start the mean of the first 2."""
    study = two_arm_study(tmp_path)
    rates = {0: [0.5, 0.25, 0.0, 1.0], 1: [0.0, 0.0, 0.5, 0.5], 2: [1.0, 0.5, 0.5, 0.0]}
    for cell in cells(study, tmp_path):
        cell.run_dir.mkdir(parents=True)
        rows = [{"step": 0, "eval_success": 0.25}] + [
            {"step": step, "tool_rate": value} for step, value in enumerate(rates[cell.seed], 1)
        ]
        (cell.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    smoothed = Metric("tool_rate", "tool rate", "last:2")
    done = [c for c in cells(study, tmp_path) if c.arm == "base"]
    assert [reduce(read_metrics(c), smoothed) for c in done] == [0.5, 0.5, 0.25]
    first = Metric("tool_rate", "tool rate", "first:2")
    assert [reduce(read_metrics(c), first) for c in done] == [0.375, 0.0, 0.75]
    table = build(study, Table("arms", "arms", (smoothed,)), done, read_metrics)
    # start mean (0.375 + 0 + 0.75) / 3 = 0.375; end 0.42 ± 0.14; change +0.04 ± 0.39
    assert table.splitlines()[2].startswith("| base | 3 | 0.38 | 0.42 ± 0.14 | +0.04 ± ")
    with pytest.raises(UsageError, match="unknown reduce 'last:0'"):
        reduce(read_metrics(done[0]), Metric("tool_rate", "tool rate", "last:0"))


def test_provenance_shortens_the_root_a_cell_ran_in(tmp_path: Path) -> None:
    """A cell run in another checkout (its runs copied here) reads with relative paths."""
    command = [
        "/venv/bin/python3",
        "-m",
        "turnrl.cli",
        "train",
        "--config",
        "/elsewhere/examples/x.toml",
        "warm_start.init_from=/elsewhere/runs/studies/s/warm/ws0/warm_start",
        f"extra={tmp_path}/here.toml",
        "run_dir=/elsewhere/runs/studies/s/a/seed0",
    ]
    text = provenance.block(tmp_path, "run", "summarise", [{"command": command}])
    assert (
        "- one cell's exact command: `python -m turnrl.cli train --config examples/x.toml "
        "warm_start.init_from=runs/studies/s/warm/ws0/warm_start extra=here.toml "
        "run_dir=runs/studies/s/a/seed0`"
    ) in text.splitlines()


def test_summarise_fills_the_doc_between_markers(tmp_path: Path) -> None:
    study = two_arm_study(tmp_path)
    finish(study, tmp_path)
    doc = tmp_path / "doc.md"
    doc.write_text(
        "intro\n\n<!-- study:toy:arms -->\nold numbers\n<!-- /study:toy:arms -->\n\nafter\n"
    )
    result = summarise(study, tmp_path)
    text = doc.read_text()
    assert result.doc_tables == ["arms"]
    assert "old numbers" not in text and "| new | 3 | 0.25 | 0.80 ± 0.18 |" in text
    assert text.startswith("intro\n\n<!-- study:toy:arms -->\n") and text.endswith("after\n")
    assert "6 of 6 declared cells finished" in text
    assert "## provenance" in result.text and "6 minutes of wall time" in result.text
    assert result.figure == tmp_path / "docs" / "img" / "study-toy.png"
    assert result.figure.read_bytes().startswith(b"\x89PNG")


def test_markers_find_tables_and_refuse_broken_blocks(tmp_path: Path) -> None:
    doc = tmp_path / "d.md"
    doc.write_text(
        "| a | b |\n|---|---|\n\n<!-- table:reference -->\n| k | v |\n|---|---|\n\n"
        "```\n| not | a table |\n|---|---|\n```\n\n"
        "<!-- study:demo-seeds:seeds -->\n| x |\n|---:|\n<!-- /study:demo-seeds:seeds -->\n"
        "<!-- study:nobody:t -->\n<!-- /study:nobody:t -->\n"
    )
    found = markers.tables(doc)
    assert [(t.line, t.study, t.reference) for t in found] == [
        (1, None, False),
        (5, None, True),
        (14, "demo-seeds", False),
    ]
    assert markers.problems([doc], known_tables()) == [
        f"{doc}:17: marker names nobody:t, which no declared study or measurement writes",
        f"{doc}:1: table outside any study marker and not marked <!-- table:reference -->",
    ]
    doc.write_text("<!-- study:a:b -->\n| x |\n|---|\n")
    with pytest.raises(InputError, match=r"d.md:1: marker a:b never closed"):
        markers.tables(doc)


def test_every_doc_table_names_its_study() -> None:
    """Every table in docs/ and the README is written by a declared study or measurement
    (between its markers) or is marked as a reference table."""
    paths = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    assert markers.problems(paths, known_tables()) == []


def test_every_study_with_a_doc_has_its_markers() -> None:
    """A regenerated study has a block for each of its tables; one not yet regenerated
    keeps its older tables in blocks of their own (with the line saying so)."""
    for study in STUDIES.values():
        if study.doc is None:
            continue
        lines = (ROOT / study.doc).read_text().splitlines()
        found = {b.table for b in markers.blocks(ROOT / study.doc, lines) if b.study == study.name}
        assert set(study.doc_tables) <= found <= set(study.table_names), study.name
        if not study.regenerated:
            assert found >= {t.name for t in study.tables}, study.name


def test_every_study_has_the_make_target_that_study_list_names() -> None:
    """`turnrl study list` tells the user `make study-NAME`: the Makefile's STUDIES has
    every declared study (and nothing else)."""
    line = next(
        line
        for line in (ROOT / "Makefile").read_text().splitlines()
        if line.startswith("STUDIES :=")
    )
    assert sorted(line.split(":=", 1)[1].split()) == sorted(STUDIES)


def test_demo_seeds_table_from_its_declaration(tmp_path: Path) -> None:
    """The README's demo table (the ``demo-seeds`` study) on hand-written metrics."""
    study = STUDIES["demo-seeds"]

    def row(step: int, success: float, easy: float, tool: float) -> str:
        return json.dumps(
            {
                "step": step,
                "eval_success": success,
                "eval_success_easy": easy,
                "eval_success_hard": 0.5,
                "eval_tool_rate": tool,
            }
        )

    every = {c.seed: c for c in cells(study, tmp_path)}
    for seed, rows in (
        (5, [row(0, 0.1, 0.2, 0.0), row(10, 0.5, 0.4, 1.0), row(20, 0.9, 0.8, 1.0)]),
        (2, [row(0, 0.25, 0.5, 0.0), row(1, 0.0, 0.0, 0.0)]),
    ):
        every[seed].run_dir.mkdir(parents=True)
        (every[seed].run_dir / "metrics.jsonl").write_text(
            "\n".join([*rows, json.dumps({"step": 1, "loss": 0.1})]) + "\n"
        )
    done = [every[2], every[5]]
    lines = build(study, study.tables[0], done, read_metrics).splitlines()
    assert lines[0] == (
        "| seed | success start → end | easy start → end | hard start → end "
        "| tool rate start → end | lowest success after step 0 |"
    )
    assert lines[2:4] == [
        "| 2 | 0.25 → 0.00 | 0.50 → 0.00 | 0.50 → 0.50 | 0.00 → 0.00 | 0.00 |",
        "| 5 | 0.10 → 0.90 | 0.20 → 0.80 | 0.50 → 0.50 | 0.00 → 1.00 | 0.50 |",
    ]


def test_cli_lists_studies_and_refuses_unknown_ones(capsys: pytest.CaptureFixture) -> None:
    from turnrl.cli import main

    assert main(["study", "list", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    for name in STUDIES:
        assert f"make study-{name}" in out
    assert "grouping-gradient" in out  # a measurement, listed with its command
    assert main(["study", "summarise", "no-such-study"]) == 2
    assert "unknown study 'no-such-study'; declared: demo-seeds" in capsys.readouterr().err
    assert main(["study", "run", "grouping-gradient"]) == 2
    assert "a measurement, not a matrix of runs" in capsys.readouterr().err
    assert main(["study", "interval", "--", "0.1", "0.2", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "pairs 3  mean +0.200  sd (ddof=1) 0.100" in out
    assert "95% t-CI [-0.048, +0.448]  not detected (n = 3 seeds; paired t p = 0.074" in out
    assert main(["study", "power", "demo-seeds"]) == 2
    assert "study 'demo-seeds': no paired table" in capsys.readouterr().err


def test_power_reports_the_pilots_sd_and_the_designs_mde(tmp_path: Path) -> None:
    from turnrl.study.power import report

    study = two_arm_study(tmp_path)
    finish(study, tmp_path)
    text = report(study, study, tmp_path, effect=0.1)
    assert text.splitlines()[0] == (
        "toy: outcome 'success' (eval_success, last); design n = 3 seeds; two-sided paired t, "
        "alpha 0.05, power 80%"
    )
    assert "n = 3 < 6: the sign-flip test cannot reach p < 0.05 (smallest p 0.25)" in text
    # pilot differences +0.25, +0.05, +0.30: sd sqrt(0.0175) = 0.132; MDE 3.264 sd = 0.432;
    # an effect of 0.1 needs 16 seeds
    row = text.splitlines()[-1].split()
    assert row == ["–", "new", "−", "base", "3", "seeds", "0.132", "0.432", "16"]
