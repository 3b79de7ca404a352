"""Issue #15, "crashes instead of clear errors": each bad input the issue lists, run
through the command line as a user would, gives exit code 2, one line naming the
file, line and field (or the option), no traceback, and writes nothing."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from turnrl.cli import main

GOOD = [
    {"task_id": "t", "traj_id": f"a{i}", "turn": 0, "reward": float(i), "done": True}
    for i in range(3)
]


def log_with(tmp_path: Path, last_line: bytes) -> Path:
    """Three good records, then ``last_line`` as line 4."""
    path = tmp_path / "in.jsonl"
    good = b"".join(json.dumps(r).encode() + b"\n" for r in GOOD)
    path.write_bytes(good + last_line + b"\n")
    return path


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


REC = b'{"task_id": "t", "traj_id": "b", "turn": 0, "done": true, '
BAD_LINES = {
    "turn 2**63": (REC + b'"reward": 1, "turn": 9223372036854775808}').replace(b'"turn": 0, ', b""),
    "401-digit reward": REC + b'"reward": ' + b"9" * 401 + b"}",
    "float overflow": REC + b'"reward": 1e400}',
    "NaN reward": REC + b'"reward": NaN}',
    "deep nesting": REC + b'"reward": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "invalid UTF-8": REC + b'"reward": 1, "response": "ok \xff"}',
    "lone surrogate in an id": REC.replace(b'"b"', b'"b\\ud800"') + b'"reward": 1}',
    "lone surrogate in a message": REC
    + b'"reward": 1, "prompt": [{"role": "user", "content": "x\\udc00"}]}',
    "duplicate key": REC + b'"reward": 1, "reward": 2}',
    "duplicate key in a message": REC
    + b'"reward": 1, "prompt": [{"role": "user", "role": "system"}]}',
}
EXPECTED = {
    "turn 2**63": "in.jsonl:4: field 'turn': integer 9223372036854775808 does not fit in 64 bits",
    "401-digit reward": "in.jsonl:4: field 'reward': integer of 401 digits does not fit in 64 bits",
    "float overflow": "in.jsonl:4: field 'reward': number overflows a 64-bit float",
    "NaN reward": "in.jsonl:4: field 'reward': NaN is not a JSON number",
    "deep nesting": "in.jsonl:4: JSON nested too deeply for the parser",
    "invalid UTF-8": "in.jsonl:4: field 'response': is not UTF-8 (byte 88 of the line)",
    "lone surrogate in an id": "in.jsonl:4: field 'traj_id': has a lone surrogate \\ud800",
    "lone surrogate in a message": "in.jsonl:4: field 'prompt[0].content': has a lone surrogate",
    "duplicate key": "in.jsonl:4: field 'reward': appears twice in one object",
    "duplicate key in a message": "in.jsonl:4: field 'prompt[0].role': appears twice",
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
@pytest.mark.parametrize("command", ["audit", "credit"])
def test_bad_record_lines_exit_2_naming_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, command: str
) -> None:
    log = log_with(tmp_path, BAD_LINES[case])
    out = tmp_path / "out.jsonl"
    argv = ["audit", str(log)]
    if command == "credit":
        argv = ["credit", str(log), "-o", str(out), "--estimator", "grpo"]
    code, err = run(capsys, argv)
    assert code == 2
    assert err.startswith(f"turnrl {command}: error: {tmp_path}/")
    assert EXPECTED[case] in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("abc", "expected a number, got 'abc'"),
        ("NaN", "expected a finite number, got nan"),
        ("Infinity", "expected a finite number, got inf"),
        ("-Infinity", "expected a finite number, got -inf"),
        ("1e400", "expected a finite number, got inf"),
        ("9" * 401, "expected a finite number, got an integer of 401 digits"),
    ],
)
def test_bad_estimator_parameters_name_the_parameter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, shown: str
) -> None:
    log = log_with(tmp_path, json.dumps(GOOD[0] | {"traj_id": "b"}).encode())
    out = tmp_path / "out.jsonl"
    code, err = run(
        capsys,
        [
            "credit",
            str(log),
            "-o",
            str(out),
            "--estimator",
            "turn_group",
            "--param",
            f"gamma={value}",
        ],
    )
    assert code == 2
    assert f"estimator 'turn_group': parameter 'gamma': {shown}" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["audit", "{tmp}/missing.jsonl"], "missing.jsonl: cannot read file: No such file"),
        (["audit", "{tmp}"], ": is a directory, not a file"),
        (
            ["credit", "{tmp}/missing.jsonl", "-o", "{tmp}/o.jsonl", "--estimator", "grpo"],
            "missing.jsonl: cannot read file: No such file",
        ),
        (["credit", "{tmp}", "-o", "{tmp}/o.jsonl", "--estimator", "grpo"], "is a directory"),
        (["report", "{tmp}", "-o", "{tmp}/r.html"], "metrics.jsonl: no metrics file (is "),
        (["report", "{tmp}/nothing", "-o", "{tmp}/r.html"], "no metrics file"),
    ],
)
def test_missing_or_directory_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, err = run(capsys, [a.format(tmp=tmp_path) for a in argv])
    assert code == 2 and message in err
    assert list(tmp_path.iterdir()) == []


def unwritable_directory(tmp_path: Path) -> Path:
    """A directory that refuses new files to this process."""
    if os.geteuid() == 0:
        if sys.platform != "linux":
            pytest.skip("root may write anywhere; /proc is Linux-only")
        return Path("/proc")  # a pseudo file system: no regular files can be created
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    return locked


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("{tmp}/out", "-o/--output {tmp}/out: is a directory; refusing to replace it"),
        (
            "{tmp}/no/such/out.jsonl",
            "-o/--output {tmp}/no/such/out.jsonl: the directory {tmp}/no/such does not exist",
        ),
        ("{tmp}/in.jsonl/out.jsonl", "-o/--output {tmp}/in.jsonl/out.jsonl: cannot write here"),
        ("/dev/null", "-o/--output /dev/null: is not a regular file; refusing to replace it"),
        ("{locked}/out.jsonl", "-o/--output {locked}/out.jsonl: cannot create a file in {locked}"),
    ],
)
@pytest.mark.parametrize("command", ["credit", "report"])
def test_bad_output_paths_are_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str, message: str, command: str
) -> None:
    places = {"tmp": tmp_path}
    if "{locked}" in output:
        places["locked"] = unwritable_directory(tmp_path)
    (tmp_path / "out").mkdir()
    # The input is bad too: the output is checked first, so no work is done before
    # the refusal (reading and crediting a 200 MB log would be lost to a typo).
    log = tmp_path / "in.jsonl"
    log.write_text("{not json\n")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    output = output.format(**places)
    if command == "credit":
        argv = ["credit", str(log), "-o", output, "--estimator", "grpo"]
    else:
        argv = ["report", str(tmp_path / "out"), "-o", output]
    code, err = run(capsys, argv)
    assert code == 2
    assert message.format(**places) in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_an_output_that_replaces_its_input_is_written_atomically(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = log_with(tmp_path, json.dumps(GOOD[0] | {"traj_id": "b"}).encode())
    code, _ = run(capsys, ["credit", str(log), "-o", str(log), "--estimator", "grpo"])
    assert code == 0
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    # grpo over the one task: rewards 0, 1, 2, 0; mean 0.75, sample std sqrt(2.75 / 3),
    # plus the estimator's 1e-6.
    std = (2.75 / 3) ** 0.5 + 1e-6
    expected = [(r - 0.75) / std for r in (0.0, 1.0, 2.0, 0.0)]
    assert [r["advantage"] for r in rows] == pytest.approx(expected, rel=1e-12)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_crediting_a_credited_log_replaces_its_advantages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from turnrl.records import read_records

    log = log_with(tmp_path, json.dumps(GOOD[0] | {"traj_id": "b"}).encode())
    once, twice = tmp_path / "once.jsonl", tmp_path / "twice.jsonl"
    assert run(capsys, ["credit", str(log), "-o", str(once), "--estimator", "grpo"])[0] == 0
    argv = ["credit", str(once), "-o", str(twice), "--estimator", "grpo", "--param"]
    assert run(capsys, [*argv, "use_std=false"])[0] == 0
    # Read strictly (a key twice would be refused): mean-centred rewards, no std.
    rows = read_records(twice)
    assert [r.extra["advantage"] for r in rows] == [-0.75, 0.25, 1.25, -0.75]
