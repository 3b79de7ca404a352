"""Iterative GRPO loop: the no-environment guard, one tiny run end to end, the CLI."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from builders import HAGGLE_LOG
from conftest import REPO, TINY_ITERATE
from turnrl.cli import main
from turnrl.envs import make_env, make_tasks
from turnrl.envs.negotiation import HaggleEnv
from turnrl.policy import build_tiny_policy
from turnrl.train.config import load_config
from turnrl.train.iterate.config import ImproveConfig, IterateConfig
from turnrl.train.iterate.deploy import temperature_counts
from turnrl.train.iterate.improve import (
    EnvCallError,
    LoggedState,
    forbid_env_calls,
    improve_policy,
    trainable,
)
from turnrl.train.iterate.loop import IterativeGRPO
from turnrl.types import Env, StepResult

torch.set_num_threads(1)

LOG = HAGGLE_LOG


class CountingEnv(Env):
    """A user-defined environment (subclassed in a test, not registered)."""

    def reset(self, task):
        return [{"role": "user", "content": "hi"}]

    def step(self, response):
        return StepResult(None, 1.0, True)

    def snapshot(self):
        return None

    def restore(self, snapshot):
        return None


# --------------------------------------------------------------------------- the guard


def test_guard_makes_every_env_method_raise_and_restores_them() -> None:
    task = make_tasks("haggle", 1, seed=0)[0]
    env = make_env("haggle")
    mine = CountingEnv()
    with forbid_env_calls():
        with pytest.raises(EnvCallError, match=r"HaggleEnv\.step\(\)|NegotiationEnv\.reset"):
            env.reset(task)
        with pytest.raises(EnvCallError, match="step"):
            env.step("<accept/>")
        with pytest.raises(EnvCallError, match="snapshot"):
            env.snapshot()
        with pytest.raises(EnvCallError, match=r"CalculatorEnv\.step_truncated"):
            make_env("calculator").step_truncated("<acc")
        with pytest.raises(EnvCallError, match=r"CountingEnv\.step"):
            mine.step("x")
    # restored afterwards, also after nested guards and errors inside them
    with pytest.raises(RuntimeError), forbid_env_calls(), forbid_env_calls():
        raise RuntimeError("boom")
    assert env.reset(task)[0]["role"] == "system"
    assert mine.step("x").reward == 1.0
    assert HaggleEnv.step.__name__ == "step"


def _improve(score) -> dict[str, float]:
    policy = build_tiny_policy(seed=0, hidden=16, layers=1)
    states = [LoggedState("t", policy.encode_initial([{"role": "user", "content": "hi"}]))]
    cfg = ImproveConfig(steps=1, states_per_step=1, candidates=3, minibatch_size=3, kl_coef=0.1)
    optimizer = torch.optim.AdamW(trainable(policy), lr=1e-3)
    return improve_policy(
        policy,
        optimizer,
        score,
        states,
        cfg,
        max_new_tokens=4,
        reference=policy.clone_frozen(),
        seed=0,
    )


def test_improvement_raises_if_anything_calls_an_environment() -> None:
    task = make_tasks("haggle", 1, seed=0)[0]
    env = make_env("haggle")
    env.reset(task)

    def sneaky(contexts, responses):  # a "reward model" that asks the counterpart
        return np.array([env.step("<accept/>").reward for _ in contexts])

    with pytest.raises(EnvCallError, match="improvement"):
        _improve(sneaky)
    stats = _improve(lambda contexts, responses: np.array([sum(r) for r in responses], float))
    assert stats["improve_states"] == 1.0
    # The KL reference is used: 0 before the first step, positive in the second epoch.
    assert stats["improve_kl_ref"] > 0
    assert stats["improve_kl_loss"] == pytest.approx(0.1 * stats["improve_kl_ref"], rel=1e-4)


def test_improvement_recomputes_log_probs_at_the_candidates_temperature() -> None:
    policy = build_tiny_policy(seed=0, hidden=16, layers=1)
    states = [LoggedState("t", policy.encode_initial([{"role": "user", "content": "hi"}]))]
    cfg = ImproveConfig(
        steps=1, states_per_step=1, candidates=3, minibatch_size=3, epochs=1, temperature=0.7
    )
    stats = improve_policy(
        policy,
        torch.optim.AdamW(trainable(policy), lr=1e-3),
        lambda contexts, responses: np.array([float(len(r)) for r in responses]),
        states,
        cfg,
        max_new_tokens=6,
        reference=None,
        seed=0,
    )
    # one on-policy optimiser step: candidates were sampled at 0.7 and are scored at 0.7
    assert stats["improve_ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert abs(stats["improve_approx_kl_old"]) < 1e-6


def test_temperature_counts() -> None:
    assert temperature_counts(4, [0.7, 1.0, 1.3]) == [2, 1, 1]
    assert temperature_counts(2, [1.0]) == [2]
    with pytest.raises(ValueError, match="at least one"):
        temperature_counts(2, [])


# --------------------------------------------------------------------------- end to end


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def iterate_config(run_dir: Path, *extra: str) -> IterateConfig:
    """The ``tiny_iterate`` run for module-scoped fixtures (which cannot take it)."""
    recipe = REPO / "examples" / "iterate_haggle.toml"
    return load_config(IterateConfig, recipe, [*TINY_ITERATE, f"run_dir={run_dir}", *extra])


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """One tiny 2-iteration run, uninterrupted, counting ``HaggleEnv.step`` calls (all of
    them, and those made inside ``improve``): its directory and the counts. Shared by the
    end-to-end test and the resume test (which compares a killed run with it)."""
    calls = {"step": 0, "during_improve": 0}
    original_step = HaggleEnv.step
    original_improve = IterativeGRPO.improve

    def counting_step(self, response):
        calls["step"] += 1
        return original_step(self, response)

    def watched_improve(self, records, q, iteration):
        before = calls["step"]
        out = original_improve(self, records, q, iteration)
        calls["during_improve"] += calls["step"] - before
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(HaggleEnv, "step", counting_step)
        patch.setattr(IterativeGRPO, "improve", watched_improve)
        config = iterate_config(tmp_path_factory.mktemp("straight") / "run")
        run = IterativeGRPO(config, quiet=True).run()
    return run, calls


def test_tiny_run_end_to_end_without_env_calls_in_improvement(
    straight_run: tuple[Path, dict[str, int]],
) -> None:
    run, calls = straight_run
    assert calls["step"] > 0 and calls["during_improve"] == 0
    metrics = rows(run)
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert [m["conversations"] for m in metrics] == [0, 6, 12]
    last = metrics[-1]
    for key in (
        "success",
        "return",
        "q_heldout_loss",
        "q_heldout_ece",
        "q_heldout_spearman",
        "qprev_loss",
        "improve_q_before",
        "improve_q_after",
        "improve_kl_ref",
        "eval_return",
        "eval_success",
    ):
        assert key in last, key
    deployed = [json.loads(x) for x in (run / "iter-001" / "deploy.jsonl").read_text().splitlines()]
    assert len({r["traj_id"] for r in deployed}) == 6
    assert {r["temperature"] for r in deployed} == {1.0, 1.3}
    for record in deployed:  # the logged return is the reward-to-go
        later = [
            r["reward"]
            for r in deployed
            if r["traj_id"] == record["traj_id"] and r["turn"] >= record["turn"]
        ]
        assert record["mc_return"] == pytest.approx(sum(later))
    quality = json.loads((run / "iter-002" / "q_quality.json").read_text())
    assert quality["loss"] in ("mse", "bce") and quality["heldout"]["reliability"]
    saved = (
        "config.toml",
        "warm_start",
        "iter-002/q/q.pt",
        "iter-002/policy",
        "policy/config.json",
    )
    for name in saved:
        assert (run / name).exists(), name


def test_from_logs_without_env_stops_after_improving(tmp_path: Path) -> None:
    logs = tmp_path / "logs.jsonl"
    second = {**LOG, "conversation_id": "c2", "outcome": 0.0}
    logs.write_text(json.dumps(LOG) + "\n" + json.dumps(second) + "\n")
    config = load_config(
        IterateConfig,
        None,
        [
            *TINY_ITERATE,
            "env.name=",
            "iterations=3",
            "warm_start.steps=2",
            f"run_dir={tmp_path / 'run'}",
        ],
    )
    run = IterativeGRPO(config, from_logs=logs, quiet=True).run()
    metrics = rows(run)
    assert [m["step"] for m in metrics] == [0, 1]
    assert metrics[1]["conversations"] == 2 and metrics[1]["return"] == pytest.approx(0.125)
    assert "eval_return" not in metrics[1]
    assert (run / "policy" / "config.json").exists()
    deployed = (run / "iter-001" / "deploy.jsonl").read_text().splitlines()
    assert len(deployed) == 4  # one record per assistant message


def test_cli_iterate_reports_bad_logs_with_file_line_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "bad.jsonl"
    logs.write_text(json.dumps(LOG) + "\n" + json.dumps({**LOG, "outcome": "high"}) + "\n")
    code = main(
        ["iterate", "--from-logs", str(logs), "--run-dir", str(tmp_path / "r"), "env.name="]
    )
    assert code == 2
    assert f"{logs}:2: field 'outcome'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # nothing written before the input is valid


ITERATE_CLI = ("iterate", "--config", str(REPO / "examples" / "iterate_haggle.toml"), "--quiet")


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``turnrl iterate`` of the tiny recipe, 1 iteration: its run directory and what it
    printed (the exit code is asserted here)."""
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(
            [
                *ITERATE_CLI,
                "--run-dir",
                str(run_dir),
                *TINY_ITERATE,
                "iterations=1",
                "logging.report=true",
            ]
        )
    assert code == 0
    return run_dir, printed.getvalue()


def test_cli_iterate_runs(cli_run: tuple[Path, str]) -> None:
    run_dir, out = cli_run
    assert "report:" in out and (run_dir / "report.html").exists()


# --------------------------------------------------------------------------- format check


def test_check_response_is_a_pure_syntax_check() -> None:
    task = make_tasks("split_money", 1, seed=0)[0]
    env = make_env("split_money")  # never reset: the check needs no episode
    assert env.check_response(task, "<offer>45</offer>") is None
    assert env.check_response(task, "<accept/>") is None
    assert env.check_response(task, "<offer>45<aoffer>") == "unclosed <offer>"
    assert env.check_response(task, "<accccept/>") == (
        "no action; use <offer>, <accept/>, <reject/> or <end/>"
    )
    with forbid_env_calls():  # allowed inside the improvement guard
        assert env.check_response(task, "<accept/> ok") == "text after the action: 'ok'"
    calc = make_env("calculator")
    assert calc.check_response(make_tasks("calculator", 1, seed=0)[0], "<answer>3</answer>") is None
    assert calc.check_response(make_tasks("calculator", 1, seed=0)[0], "3") is not None


def _improve_with_check(check) -> tuple[dict[str, float], list[torch.Tensor], list[str]]:
    """Two improvement steps where Q prefers responses with large token ids; returns the stats, the
    weights after, and every text the check saw."""
    policy = build_tiny_policy(seed=0, hidden=16, layers=1)
    states = [LoggedState("t", policy.encode_initial([{"role": "user", "content": "hi"}]))]
    cfg = ImproveConfig(steps=2, states_per_step=1, candidates=3, minibatch_size=3, kl_coef=0.0)
    seen: list[str] = []

    def watched(state: LoggedState, text: str) -> str | None:
        seen.append(text)
        return check(text)

    stats = improve_policy(
        policy,
        torch.optim.AdamW(trainable(policy), lr=1e-2, weight_decay=0.0),
        lambda contexts, responses: np.array([float(sum(r)) for r in responses]),
        states,
        cfg,
        max_new_tokens=6,
        reference=None,
        seed=0,
        check=watched,
        malformed_score=-1.0,
    )
    return stats, [p.detach().clone() for p in policy.parameters()], seen


def test_rejected_candidates_get_the_malformed_score() -> None:
    start = [
        p.detach().clone() for p in build_tiny_policy(seed=0, hidden=16, layers=1).parameters()
    ]
    # Every candidate rejected: equal scores, zero advantages, no KL -> no change.
    stats, after, seen = _improve_with_check(lambda text: "bad")
    assert len(seen) == 12  # probe before (3), 2 steps x 3 candidates, probe after (3)
    assert stats["improve_malformed"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(start, after, strict=True))
    # Nothing rejected: Q's preference moves the weights.
    stats, after, _ = _improve_with_check(lambda text: None)
    assert stats["improve_malformed"] == 0.0
    assert not all(torch.equal(a, b) for a, b in zip(start, after, strict=True))


# --------------------------------------------------------------------------- resume

TIMING = ("seconds_deploy", "seconds_q", "seconds_improve", "seconds_eval")


def comparable(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in m.items() if k not in TIMING} for m in rows(run_dir)]


def test_killed_run_resumes_to_the_same_numbers(
    tmp_path: Path, tiny_iterate, straight_run: tuple[Path, dict[str, int]]
) -> None:
    """Stopped after iteration 1 of 2 (a half-written metrics line after it), resumed:
    the same metrics and final weights as the uninterrupted run (``straight_run``, whose
    ``HaggleEnv.step`` counting changes no number)."""
    straight, _ = straight_run
    killed = IterativeGRPO(tiny_iterate(tmp_path / "b"), quiet=True).run(stop_after=1)
    assert [m["step"] for m in rows(killed)] == [0, 1]
    assert not (killed / "policy").exists()
    # A crash half-way through writing iteration 2's metrics line: dropped on resume.
    with (killed / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 2, "conversa')
    # the global RNG is the checkpoint's after restoring (building models draws from it)
    saved = torch.load(killed / "checkpoints" / "step-000001.pt", weights_only=True)
    trainer = IterativeGRPO(tiny_iterate(killed), quiet=True, resume=True)
    checkpoint = trainer.run_directory.start()
    assert checkpoint is not None and checkpoint.step == 1
    trainer._restore(checkpoint)
    assert torch.equal(torch.get_rng_state(), saved["rng"]["torch"])
    resumed = IterativeGRPO(tiny_iterate(killed), quiet=True, resume=True).run()
    assert comparable(resumed) == comparable(straight)
    a = torch.load(straight / "checkpoints" / "step-000002.pt", weights_only=True)
    b = torch.load(resumed / "checkpoints" / "step-000002.pt", weights_only=True)
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert a["extra"] == b["extra"]
    # Resuming a finished run changes nothing; --resume without checkpoints starts fresh.
    IterativeGRPO(tiny_iterate(resumed), quiet=True, resume=True).run()
    assert comparable(resumed) == comparable(straight)
    fresh = IterativeGRPO(tiny_iterate(tmp_path / "c"), quiet=True, resume=True).run(stop_after=1)
    assert [m["step"] for m in rows(fresh)] == [0, 1]


def test_cli_resume_extends_a_finished_run(cli_run: tuple[Path, str], tmp_path: Path) -> None:
    """``turnrl iterate --resume`` with more iterations than a finished run had (a copy of
    ``cli_run``'s, 1 iteration) runs the missing one."""
    run_dir = tmp_path / "run"
    shutil.copytree(cli_run[0], run_dir)
    args = [*ITERATE_CLI, "--run-dir", str(run_dir), "--resume", *TINY_ITERATE, "iterations=2"]
    assert main(args) == 0
    assert [m["step"] for m in rows(run_dir)] == [0, 1, 2]
    assert [m["conversations"] for m in rows(run_dir)] == [0, 6, 12]


def test_each_rejected_candidate_and_only_it_gets_the_malformed_score(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from turnrl.table import TurnTable

    captured: list[list[dict]] = []
    original = TurnTable.from_records.__func__  # type: ignore[attr-defined]

    def capture(cls, records, **kwargs):
        captured.append(list(records))
        return original(cls, records, **kwargs)

    monkeypatch.setattr(TurnTable, "from_records", classmethod(capture))
    verdicts: list[tuple[str, bool]] = []

    def every_other(text: str) -> str | None:  # rejects candidates 0, 2, 4, ...
        verdicts.append((text, len(verdicts) % 2 == 0))
        return "rejected" if verdicts[-1][1] else None

    stats, _, _ = _improve_with_check(every_other)
    rows = [r for records in captured for r in records]
    assert len(rows) == 6 and len(verdicts) == 12  # probes: 3 before, 3 after the steps
    probe_before, steps, probe_after = verdicts[:3], verdicts[3:9], verdicts[9:]
    policy = build_tiny_policy(seed=0, hidden=16, layers=1)
    for row, (text, rejected) in zip(rows, steps, strict=True):
        ids = list(row.response_ids)
        body = ids[:-1] if ids and ids[-1] == policy.eos_token_id else ids
        assert policy.decode(body) == text  # the check saw this row's response
        assert row.q == (-1.0 if rejected else float(sum(ids)))
    assert stats["improve_malformed"] == 0.5  # steps: 1 of 3, then 2 of 3
    assert stats["improve_probe_malformed_before"] == sum(r for _, r in probe_before) / 3 == 2 / 3
    assert stats["improve_probe_malformed_after"] == sum(r for _, r in probe_after) / 3 == 1 / 3
    assert stats["improve_score_before"] < stats["improve_q_before"]  # two scored -1 instead
