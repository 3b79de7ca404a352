"""Every config error of docs/config-errors.md fails within the CLI's start-up: exit 2,
the documented message, no file written and no model built (the table in the doc is the
test's input, so the doc stays true)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from conftest import REPO
from turnrl.cli import main

DOC = REPO / "docs" / "config-errors.md"


def table_rows() -> list[tuple[str, str, str]]:
    """``(kind, command, message)`` of each row between the table markers."""
    text = DOC.read_text(encoding="utf-8")
    body = text.split("<!-- config-errors-table: start -->")[1].split(
        "<!-- config-errors-table: end -->"
    )[0]
    rows = []
    for line in body.strip().splitlines()[2:]:  # skip the header and the rule
        kind, command, message = (cell.strip() for cell in line.strip().strip("|").split(" | "))
        rows.append((kind, command.strip("`"), message.strip("`")))
    return rows


ROWS = table_rows()


def test_the_table_covers_every_kind_the_issue_names() -> None:
    kinds = " ".join(kind for kind, _, _ in ROWS)
    for kind in (
        "estimator",
        "strategy",
        "aggregation",
        "KL estimator",
        "estimator parameter",
        "tasks per step",
        "negative temperature",
        "minibatch_size",
        "keep_checkpoints",
        "negative steps",
    ):
        assert kind in kinds, kind


class WorkStarted(Exception):
    """Raised if a command got past its checks (a model built, a run started)."""


@pytest.mark.parametrize(("kind", "command", "message"), ROWS, ids=[r[0] for r in ROWS])
def test_config_error_exits_2_before_any_work(
    kind: str,
    command: str,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import turnrl.train.iterate.loop as iterate
    import turnrl.train.online.trainer as online
    from turnrl.train.run import RunDirectory

    def refuse(*args, **kwargs):
        raise WorkStarted(kind)

    for module in (online, iterate):
        monkeypatch.setattr(module, "build_policy", refuse)
    monkeypatch.setattr(RunDirectory, "start", refuse)
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(command)
    assert argv[0] == "turnrl"
    argv = [re.sub(r"^examples", str(REPO / "examples"), arg) for arg in argv[1:]]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own usage errors
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written, not even the run directory
