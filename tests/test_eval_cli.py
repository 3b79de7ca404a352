"""``turnrl eval``: on a finished run's last checkpoint and the config's held-out tasks
it gives the run's last in-training evaluation exactly (an environment run, full weights
and LoRA adapters, and an agent program through the gateway); a task file gives the same
numbers on the same tasks; bad input is one line naming the file, line and field, exit
code 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, TINY_TRAIN, ParityEnv, parity_demonstration
from turnrl.cli import main
from turnrl.envs import ENVS, EnvSpec, register_env
from turnrl.train.agent.loop import AgentTrainer
from turnrl.train.config import RunConfig, load_config
from turnrl.train.online.trainer import OnlineTrainer
from turnrl.train.task_split import task_split
from turnrl.types import Task

CALCULATOR = REPO / "examples" / "calculator.toml"
FIXTURES = Path(__file__).with_name("agent_fixtures.py")


def tagged_parity_tasks(n: int, seed: int) -> list[Task]:
    """conftest's parity tasks in two kinds (``even``/``odd`` index), for per-kind numbers."""
    return [Task(f"tp{seed}-{i}", {"k": i}, ("even" if i % 2 == 0 else "odd",)) for i in range(n)]


if "tagged_parity" not in ENVS:
    register_env("tagged_parity", EnvSpec(ParityEnv, tagged_parity_tasks, parity_demonstration))

RUN = (
    *TINY_TRAIN,
    "env.name=tagged_parity",
    "env.env_kwargs={}",
    "env.task_kwargs={}",
    "warm_start.steps=0",
    "train.steps=2",
    "train.lr=0.01",
    "train.eval_temperature=1.0",
    "train.eval_samples=3",
)
"""The untrained tiny model on two-turn parity tasks (a reply of odd length pays), 2 RL
steps at a learning rate that changes what it samples (measured: held-out success 0.25
after the warm start, 0.17 after RL), each evaluation 3 sampled episodes per task:
outcomes that differ by task, kind and weights."""


def eval_rows(run: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in row.items() if k.startswith("eval_")}
        for row in rows
        if "eval_success" in row
    ]


def run_eval(*args: str) -> dict[str, Any]:
    out = Path(args[args.index("-o") + 1])
    assert main(["eval", *args, "--quiet"]) == 0
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def parity_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run (:data:`RUN`)."""
    run = tmp_path_factory.mktemp("parity") / "run"
    return OnlineTrainer(
        load_config(RunConfig, CALCULATOR, [*RUN, f"run_dir={run}"]), quiet=True
    ).run()


def test_eval_of_a_finished_run_equals_its_last_in_training_evaluation(
    parity_run: Path, tmp_path: Path
) -> None:
    first, *_, expected = eval_rows(parity_run)
    # RL changed what the policy samples: the warm start's weights would not match
    assert first["eval_success"] != expected["eval_success"]
    out = tmp_path / "eval"
    summary = run_eval(
        "--policy", str(parity_run), "--config", str(CALCULATOR), *RUN, "-o", str(out)
    )
    assert summary["step"] == 2 and summary["samples"] == 3
    assert summary["metrics"] == expected  # every eval_* key, exactly
    # the breakdown is the same episodes: overall and per-kind numbers are the run's
    breakdown = summary["breakdown"]
    assert breakdown["all"]["success"] == expected["eval_success"] > 0
    for kind in ("even", "odd"):
        assert breakdown[kind]["success"] == expected[f"eval_success_{kind}"]
        assert breakdown[kind]["turns"] == expected[f"eval_turns_{kind}"]
        assert breakdown[kind]["tool_call_rate"] == expected[f"eval_tool_rate_{kind}"]
    rows = [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(row["samples"] == 3 for row in rows)
    assert sum(r["successes"] for r in rows) == round(expected["eval_success"] * 12)
    records = (out / "records.jsonl").read_text().splitlines()
    assert len(records) == round(expected["eval_turns"] * 12)
    assert "| all |" in (out / "eval.md").read_text()
    assert '<table id="eval">' in (out / "eval.html").read_text()


def test_a_task_file_of_the_held_out_tasks_gives_the_same_numbers(
    parity_run: Path, tmp_path: Path
) -> None:
    config = load_config(RunConfig, CALCULATOR, list(RUN))
    tasks = tmp_path / "tasks.jsonl"
    lines = [
        json.dumps({"task_id": t.task_id, "tags": list(t.tags), **t.payload})
        for t in task_split(config.env).eval
    ]
    tasks.write_text("\n".join(lines) + "\n")
    out = ["--tasks", str(tasks), "-o", str(tmp_path / "out")]
    summary = run_eval("--policy", str(parity_run), "--config", str(CALCULATOR), *RUN, *out)
    assert summary["metrics"] == eval_rows(parity_run)[-1]


def calculator_eval(tmp_path: Path, tasks: Path) -> list[str]:
    """``turnrl eval`` arguments on the calculator with a task file (the policy is never
    loaded: the task file is checked first)."""
    args = ["eval", "--policy", str(tmp_path), "--config", str(CALCULATOR), *TINY_TRAIN]
    return [*args, "--tasks", str(tasks), "-o", str(tmp_path / "out")]


def test_a_bad_task_file_line_names_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    good = {"task_id": "calc-1+2", "tags": ["easy"], "question": "Compute 1+2.", "answer": "3"}
    bad = {"task_id": "calc-2+2", "question": "Compute 2+2.", "expression": "2+2"}
    tasks.write_text(json.dumps({**good, "expression": "1+2"}) + "\n\n" + json.dumps(bad) + "\n")
    assert main(calculator_eval(tmp_path, tasks)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"turnrl eval: error: {tasks}:3: field 'answer': missing")
    assert len(err.splitlines()) == 1
    tasks.write_text(json.dumps({**good, "expression": "1+2"}) + "\n{not json\n")
    assert main(calculator_eval(tmp_path, tasks)) == 2
    assert f"{tasks}:2: malformed JSON" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_parquet_task_file_needs_pyarrow(tmp_path: Path, capsys) -> None:
    tasks = tmp_path / "tasks.parquet"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        tasks.write_bytes(b"PAR1")
        assert main(calculator_eval(tmp_path, tasks)) == 2
        assert "needs pyarrow" in capsys.readouterr().err
        return
    rows = [{"task_id": "calc-1+2", "tags": ["easy"], "question": "Compute 1+2."}]
    pq.write_table(pa.Table.from_pylist(rows), tasks)
    assert main(calculator_eval(tmp_path, tasks)) == 2
    assert f"{tasks}: row 1: field 'expression': missing" in capsys.readouterr().err


def test_a_parquet_task_file_reads_as_the_same_tasks_in_jsonl(tmp_path: Path) -> None:
    """A Parquet task file gives the tasks its JSONL twin gives, each located by row."""
    pa = pytest.importorskip("pyarrow", reason="pyarrow is the [parquet] extra (make setup)")
    import pyarrow.parquet as pq

    from turnrl.train.eval_tasks import read_tasks

    rows = [
        {"task_id": "calc-1+2", "tags": ["easy"], "expression": "1+2", "answer": "3"},
        {"task_id": "calc-7*6", "tags": ["hard"], "expression": "7*6", "answer": "42"},
    ]
    parquet, jsonl = tmp_path / "tasks.parquet", tmp_path / "tasks.jsonl"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows))
    from_parquet, where = read_tasks(parquet)
    assert from_parquet == read_tasks(jsonl)[0]
    assert [t.task_id for t in from_parquet] == ["calc-1+2", "calc-7*6"]
    assert where == [f"{parquet}: row 1", f"{parquet}: row 2"]


def test_a_directory_that_holds_no_policy_is_refused(tmp_path: Path, capsys) -> None:
    args = ["eval", "--policy", str(tmp_path), "--config", str(CALCULATOR), *TINY_TRAIN]
    assert main([*args, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"--policy: {tmp_path} is neither a run directory" in err


def test_eval_of_an_agent_run_through_the_gateway_equals_its_last_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unchanged agent program against a gateway over the run's last checkpoint;
    ``--config`` defaults to the run's own copy. One call at a time (concurrency 1):
    in training and here every call is sampled alone, so greedy decoding is exact."""
    from test_agent_loop import agent_config

    monkeypatch.setenv("TURNRL_TEST_LOG", str(tmp_path / "calls.jsonl"))
    config = agent_config(tmp_path, "agent.concurrency=1", f"agent.entrypoint={FIXTURES}:two_calls")
    run = AgentTrainer(config, quiet=True).run()
    summary = run_eval("--policy", str(run), "-o", str(tmp_path / "out"))
    expected = eval_rows(run)[-1]
    assert summary["metrics"] == expected and summary["agent_failures"] == 0
    assert summary["breakdown"]["all"]["episodes"] == 2
    assert summary["breakdown"]["all"]["turns"] == expected["eval_turns"] == 2.0


def test_eval_of_a_lora_run_loads_its_adapters_and_equals_its_last_evaluation(
    tmp_path: Path,
) -> None:
    """A LoRA run checkpoints only the adapters: they are loaded over the saved warm
    start's (itself adapters over the base model), as a resumed run loads them."""
    run = tmp_path / "run"
    lora = ("policy.lora_rank=4", "policy.lora_alpha=8.0", f"run_dir={run}")
    OnlineTrainer(load_config(RunConfig, CALCULATOR, [*RUN, *lora]), quiet=True).run()
    first, *_, last = eval_rows(run)
    assert first["eval_success"] != last["eval_success"]  # the adapters changed it
    summary = run_eval("--policy", str(run), "-o", str(tmp_path / "out"))
    assert summary["step"] == 2
    assert summary["metrics"] == last


def test_eval_of_the_export_of_a_run_equals_its_last_evaluation(
    parity_run: Path, tmp_path: Path
) -> None:
    """``turnrl export``'s model directory (float32 weights, no LoRA) is the same policy."""
    exported = tmp_path / "exported"
    assert main(["export", str(parity_run), "-o", str(exported)]) == 0
    out = ["-o", str(tmp_path / "out")]
    summary = run_eval("--policy", str(exported), "--config", str(CALCULATOR), *RUN, *out)
    assert summary["step"] is None and summary["policy"] == str(exported)
    assert summary["metrics"] == eval_rows(parity_run)[-1]
