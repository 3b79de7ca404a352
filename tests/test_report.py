"""HTML report and summaries on synthetic run directories."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from turnrl.errors import InputError
from turnrl.io import append_jsonl
from turnrl.report import label_summary, load_runs, metric_order, summary, write_report


def _make_run(
    root: Path,
    name: str,
    rows: list[dict[str, object]],
    *,
    label: str | None = None,
    partial_tail: bool = False,
) -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    for row in rows:
        append_jsonl(run_dir / "metrics.jsonl", row)
    if partial_tail:
        with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as handle:
            handle.write('{"step": 99, "succ')
    config = f'label = "{label}"\n' if label else ""
    (run_dir / "config.toml").write_text(config + "[train]\nlr = 0.001\n")
    return run_dir


def _rows(n: int, offset: float = 0.0, with_kl: bool = True) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for step in range(n):
        row: dict[str, object] = {
            "step": step,
            "success": step / n + offset,
            "adv_mean_turn10": 0.0,
            "adv_mean_turn2": 0.1,
            "loss": 1.0 - step / n,
            "note": "text is not a metric",
        }
        if with_kl:
            row["kl"] = 0.01 * step
        if step % 2 == 0:
            row["eval_success"] = 0.5
        rows.append(row)
    return rows


def _img_alts(text: str) -> list[str]:
    return re.findall(r'<img alt="([^"]+)" src="data:image/svg\+xml,', text)


def test_report_with_missing_metric_and_partial_line(tmp_path: Path) -> None:
    a = _make_run(tmp_path, "run-a", _rows(6))
    b = _make_run(tmp_path, "run-b", _rows(4, with_kl=False), partial_tail=True)
    out = write_report([a, b], tmp_path / "out" / "report.html")
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    # one plot per panel; metrics with one value everywhere are listed, not plotted
    assert _img_alts(text) == ["Training success", "Loss", "KL"]
    flat = text[text.index('<details id="flat">') :]
    for key in ("eval_success", "adv_mean_turn2", "adv_mean_turn10"):
        assert f"<td>{key}</td>" in flat
    assert "run-a" in text
    assert "run-b" in text
    assert "lr = 0.001" in text  # config copy embedded
    assert "<td>note</td>" not in text  # a text field is not a metric


def test_labels_group_seeds_with_band(tmp_path: Path) -> None:
    runs = [
        _make_run(tmp_path, "grpo-s0", _rows(5, 0.0), label="grpo"),
        _make_run(tmp_path, "grpo-s1", _rows(5, 0.2), label="grpo"),
        _make_run(tmp_path, "rtpo-s0", _rows(3, 0.1), label="rtpo"),
    ]
    text = write_report(runs, tmp_path / "r.html", smoothing=2).read_text()
    assert "Per label: mean ± std" in text
    assert _img_alts(text) == ["Training success", "Loss", "KL"]
    assert "smoothed over 2 steps" in text
    finals = label_summary(runs)
    mean, std, n = finals["grpo"]["success"]
    assert (mean, n) == (pytest.approx(0.9), 2)
    assert std == pytest.approx(0.2 / 2**0.5)
    assert finals["rtpo"]["success"] == (pytest.approx(2 / 3 + 0.1), 0.0, 1)


def test_summary_final_values(tmp_path: Path) -> None:
    a = _make_run(tmp_path, "a", _rows(4))
    b = _make_run(tmp_path, "b", _rows(2, with_kl=False), partial_tail=True)
    result = summary([a, b])
    assert result["a"]["success"] == pytest.approx(0.75)
    assert result["a"]["eval_success"] == 0.5
    assert result["a"]["kl"] == pytest.approx(0.03)
    assert "kl" not in result["b"]
    assert result["b"]["success"] == pytest.approx(0.5)
    assert list(result["a"])[:2] == ["success", "eval_success"]
    assert summary([a], last=2)["a"]["success"] == pytest.approx((0.5 + 0.75) / 2)


def test_resumed_run_later_record_wins_and_names_are_unique(tmp_path: Path) -> None:
    a = _make_run(tmp_path / "x", "seed0", [{"step": 0, "loss": 1.0}, {"step": 1, "loss": 2.0}])
    append_jsonl(a / "metrics.jsonl", {"step": 1, "loss": 3.0})  # resumed after a crash
    b = _make_run(tmp_path / "y", "seed0", [{"step": 0, "loss": 1.0}])
    runs = load_runs([a, b])
    assert [run.name for run in runs] == ["x/seed0", "y/seed0"]
    assert runs[0].series("loss") == ([0.0, 1.0], [1.0, 3.0])


def test_metric_order_is_curated_then_alphabetical() -> None:
    keys = ["zeta", "loss", "adv_std_turn0", "adv_mean_turn11", "adv_mean_turn1", "success", "a"]
    assert metric_order(keys) == [
        "success",
        "adv_mean_turn1",
        "adv_mean_turn11",
        "adv_std_turn0",
        "loss",
        "a",
        "zeta",
    ]


def test_missing_metrics_file_and_corrupt_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"metrics\.jsonl: no metrics file"):
        write_report([tmp_path], tmp_path / "r.html")
    run_dir = tmp_path / "bad"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n{oops\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2"):
        write_report([run_dir], tmp_path / "r.html")


def test_json_config_label(tmp_path: Path) -> None:
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    append_jsonl(run_dir / "metrics.jsonl", {"step": 0, "success": 1.0})
    (run_dir / "config.json").write_text(json.dumps({"label": "mine"}))
    assert load_runs([run_dir])[0].label == "mine"


# ------------------------------------------------------------ held-out before/after
def _eval_rows(values: dict[int, tuple[float, float, float]]) -> list[dict[str, object]]:
    """Evaluation rows: step -> (eval_success, eval_success_hard, eval_tool_rate_hard)."""
    return [
        {
            "step": step,
            "eval_success": s,
            "eval_success_hard": h,
            "eval_tool_rate_hard": t,
            "eval_turns_hard": 9.0,  # not a headline metric
            "success": 0.1 * step,
        }
        for step, (s, h, t) in values.items()
    ]


def test_heldout_table_first_and_last_evaluation_per_label(tmp_path: Path) -> None:
    from turnrl.report import heldout_table
    from turnrl.report.runs import group_by_label

    runs = load_runs(
        [
            _make_run(
                tmp_path, "g0", _eval_rows({0: (0.1, 0.0, 0.0), 5: (0.5, 0.4, 1.0)}), label="g"
            ),
            _make_run(
                tmp_path, "g1", _eval_rows({0: (0.3, 0.2, 0.0), 5: (0.7, 0.8, 1.0)}), label="g"
            ),
            _make_run(
                tmp_path, "r0", _eval_rows({0: (0.2, 0.1, 0.5), 4: (0.2, 0.1, 0.5)}), label="r"
            ),
        ]
    )
    table = heldout_table(group_by_label(runs))
    assert table is not None
    assert table.labels == ["g", "r"]
    assert table.metrics == ["success", "success_hard", "tool_rate_hard"]
    assert table.steps == {"g": ("0", "5"), "r": ("0", "4")}
    before, after = table.before["g"]["success"], table.after["g"]["success"]
    assert (before.mean, before.n) == (pytest.approx(0.2), 2)
    assert before.std == pytest.approx(0.2 / 2**0.5)
    assert after.text() == "0.600 ± 0.141"
    assert table.after["r"]["tool_rate_hard"].text() == "0.500"
    text = write_report([r.path for r in runs], tmp_path / "r.html").read_text()
    assert text.index('<table id="heldout">') < text.index("<img")
    assert "<th>after RL (step 5)</th>" in text
    assert "<td>0.600 ± 0.141</td>" in text


def test_heldout_console_table_is_what_train_prints(tmp_path: Path) -> None:
    from rich.console import Console

    from turnrl.report import heldout_console_table

    run = _make_run(tmp_path, "one", _eval_rows({0: (0.1, 0.0, 0.0), 10: (0.5, 0.4, 1.0)}))
    console = Console(width=100, record=True)
    console.print(heldout_console_table(run))
    lines = [line.split() for line in console.export_text().splitlines()]
    assert ["│", "success", "│", "0.100", "│", "0.500", "│"] in lines
    assert ["│", "tool_rate_hard", "│", "0.000", "│", "1.000", "│"] in lines
    console.print(heldout_console_table(_make_run(tmp_path, "ws", _eval_rows({0: (0.1, 0, 0)}))))
    assert ["│", "success", "│", "0.100", "│", "0.100", "│"] in [
        line.split() for line in console.export_text().splitlines()
    ]  # warm start only (train.steps = 0): one evaluation, on both sides
    with pytest.raises(ValueError, match="no evaluation rows"):
        heldout_console_table(_make_run(tmp_path, "none", [{"step": 1, "success": 0.5}]))


def test_headline_metric_order() -> None:
    from turnrl.report.heldout import headline_metrics

    keys = [
        "eval_turns_hard", "eval_return", "eval_tool_rate_hard", "eval_success_hard",
        "eval_malformed_rate", "eval_success", "eval_success_easy", "eval_turns", "success",
        "eval_tool_rate", "eval_unseen",
    ]  # fmt: skip
    assert headline_metrics(keys) == [
        "success", "success_easy", "success_hard", "tool_rate", "tool_rate_hard",
        "turns", "return", "malformed_rate",
    ]  # fmt: skip


# ------------------------------------------------------------------ sections, plots
def test_sections_group_metrics_into_panels(tmp_path: Path) -> None:
    from turnrl.report.sections import build_sections

    rows = []
    for step in range(4):
        row: dict[str, object] = {"step": step}
        for key in (
            "eval_success", "eval_success_hard", "eval_tool_rate_hard", "return", "turns",
            "success", "adv_mean_turn0", "adv_mean_turn2plus", "zero_adv_group_frac", "loss",
            "pg_loss", "clip_frac", "clip_frac_low", "seconds_step", "mystery",
        ):  # fmt: skip
            row[key] = float(step * len(key))
        row["kl"] = 0.0  # flat: never plotted
        rows.append(row)
    runs = load_runs([_make_run(tmp_path, "r", rows)])
    sections = build_sections(runs, [k for k in rows[0] if k != "step"])
    layout = {s.title: [(p.title, p.metrics) for p in s.panels] for s in sections}
    assert layout == {
        "Learning curves": [
            ("Held-out success", ("eval_success", "eval_success_hard")),
            ("Held-out tool use", ("eval_tool_rate_hard",)),
            ("Return", ("return",)),
            ("Turns per episode", ("turns",)),
        ],
        "Rollouts": [("Training success", ("success",))],
        "Credit": [
            ("Advantage mean by turn", ("adv_mean_turn0", "adv_mean_turn2plus")),
            ("Zero-advantage groups", ("zero_adv_group_frac",)),
        ],
        "Optimisation": [
            ("Loss", ("loss", "pg_loss")),
            ("Clip fraction", ("clip_frac", "clip_frac_low")),
            ("Seconds per step", ("seconds_step",)),
        ],
        "Other metrics": [("mystery", ("mystery",))],
    }
    assert [s.folded for s in sections] == [False, False, False, False, True]


def test_svg_minified_keeps_text_and_rounds_coordinates() -> None:
    from turnrl.report.plots import minify_svg

    svg = (
        '<svg>\n  <path d="M 12.345678 9.87654 L 1 2"/>\n'
        '  <text x="3.14159" y="2.5">0.12345</text>\n</svg>'
    )
    assert minify_svg(svg) == (
        '<svg><path d="M 12.3 9.8 L 1 2"/><text x="3.1" y="2.5">0.12345</text></svg>'
    )


def test_auto_smoothing_window(tmp_path: Path) -> None:
    from turnrl.report.plots import auto_window

    assert auto_window(load_runs([_make_run(tmp_path, "short", _rows(6))])) == 1
    assert auto_window(load_runs([_make_run(tmp_path, "long", _rows(61))])) == 5
