"""HTML report and summaries on synthetic run directories."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

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
    return re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,', text)


def test_report_with_missing_metric_and_partial_line(tmp_path: Path) -> None:
    a = _make_run(tmp_path, "run-a", _rows(6))
    b = _make_run(tmp_path, "run-b", _rows(4, with_kl=False), partial_tail=True)
    out = write_report([a, b], tmp_path / "out" / "report.html")
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    metrics = ["success", "eval_success", "adv_mean_turn2", "adv_mean_turn10", "loss", "kl"]
    assert _img_alts(text) == metrics
    assert text.count("<img") == len(metrics)
    assert "run-a" in text
    assert "run-b" in text
    assert "lr = 0.001" in text  # config copy embedded
    assert "note" not in _img_alts(text)


def test_labels_group_seeds_with_band(tmp_path: Path) -> None:
    runs = [
        _make_run(tmp_path, "grpo-s0", _rows(5, 0.0), label="grpo"),
        _make_run(tmp_path, "grpo-s1", _rows(5, 0.2), label="grpo"),
        _make_run(tmp_path, "rtpo-s0", _rows(3, 0.1), label="rtpo"),
    ]
    text = write_report(runs, tmp_path / "r.html", smoothing=2).read_text()
    assert "Per label: mean ± std" in text
    assert len(_img_alts(text)) == 6
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
    with pytest.raises(FileNotFoundError, match=r"metrics\.jsonl"):
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
