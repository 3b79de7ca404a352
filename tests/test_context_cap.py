"""The per-turn context cap, ``rollout.max_context_tokens`` (issue #39).

Built-in environments: an episode whose next turn (prompt plus ``max_new_tokens``)
would not fit the cap ends there, truncated (``Episode.end == "context"``), after exactly
the turns that fit; a training step counts such episodes (``context_truncated``). The
gateway: a call over the cap gets a 400 ``context_length_exceeded`` with OpenAI's
message, its rollout ends truncated (later calls refused, its reward still taken); an
agent loop step trains on the other rollouts and does not count the truncated
rollouts' failures against ``agent.max_failure_fraction``. Unset, nothing changes:
the same records as without the field.

The agent programs of the agent-loop test are the functions at the end of this file
(loaded by path as ``agent.entrypoint``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from builders import TokenizerPolicy
from conftest import PARITY, REPO
from serve_scripted import ScriptedPolicy
from turnrl.envs import make_env, make_tasks
from turnrl.errors import ConfigError
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.rollout import run_episodes
from turnrl.rollout.context_cap import (
    ContextCapped,
    cap_context,
    capped_context,
    truncation_metrics,
)
from turnrl.serve import Gateway, GatewayConfig, GatewayError
from turnrl.serve.protocol import parse_chat_request
from turnrl.types import Sample

M = 20
"""``max_new_tokens`` of the environment episodes."""
CALL = "<call>1+1</call>"
"""What the scripted policy answers every turn: a tool call, so the episode goes on."""


class ToolCaller(TokenizerPolicy):
    """The tiny tokenizer's policy that writes ``CALL`` (then end-of-turn) every turn."""

    def sample(self, contexts, *, max_new_tokens, temperature=1.0, seed=None):
        ids = [*self.tokens(CALL), self.eos_token_id]
        assert len(ids) <= max_new_tokens
        return [Sample(ids, [-0.5] * len(ids), "stop", CALL) for _ in contexts]


def _episode(policy: Any, cap: int | None, max_turns: int = 10):
    task = make_tasks("calculator", 1, seed=0)[0]
    batch = run_episodes(
        cap_context(policy, cap),
        lambda: make_env("calculator", max_turns=max_turns),
        [task],
        group_size=1,
        max_new_tokens=M,
        temperature=1.0,
        seed=0,
    )
    (episode,) = batch.episodes
    return episode, batch.records


@pytest.mark.parametrize(("slack", "turns"), [(0, 3), (-1, 2), (26, 3), (27, 4)])
def test_an_environment_episode_ends_truncated_after_the_turns_that_fit(
    slack: int, turns: int
) -> None:
    policy = ToolCaller()
    task = make_tasks("calculator", 1, seed=0)[0]
    env = make_env("calculator", max_turns=10)
    first = len(policy.encode_initial(env.reset(task)))
    observation = env.step(CALL).observation
    assert observation is not None
    grows = len(policy.tokens(CALL)) + 1 + len(policy.encode_observation(observation))
    assert (first, grows) == (75, 27)  # 16 response ids + end-of-turn + 10 observation ids
    # turn t's prompt is first + t * grows; it is sampled iff prompt + M <= cap
    cap = first + 2 * grows + M + slack
    episode, records = _episode(policy, cap)
    assert (episode.turn, episode.end, episode.done) == (turns, "context", True)
    assert [r.turn for r in records] == list(range(turns))
    assert [len(r.prompt_ids) for r in records] == [first + t * grows for t in range(turns)]
    assert all(len(r.prompt_ids) + M <= cap for r in records)
    assert not records[-1].done  # cut by the cap, not ended by the environment
    # without the cap the environment's own limit ends it
    whole, _ = _episode(policy, None)
    assert (whole.turn, whole.end) == (10, "env")


def test_an_episode_whose_first_prompt_does_not_fit_takes_no_turn() -> None:
    episode, records = _episode(ToolCaller(), 75 + M - 1)
    assert (episode.turn, episode.end, records) == (0, "context", [])


def test_the_cap_is_the_smaller_context_and_unset_wraps_nothing() -> None:
    assert capped_context(4096, None) == capped_context(4096, 0) == 4096
    assert capped_context(4096, 100) == 100 and capped_context(50, 100) == 50
    assert capped_context(None, 100) == 100 and capped_context(None, 0) is None
    policy = ToolCaller(max_context=300)
    assert cap_context(policy, 0) is policy and cap_context(policy, None) is policy
    capped = cap_context(policy, 120)
    assert isinstance(capped, ContextCapped)
    assert capped.max_context == 120 and capped.eos_token_id == policy.eos_token_id
    assert cap_context(policy, 500).max_context == 300
    for bad in (0, -3, True, 2.5):
        with pytest.raises(ValueError, match=r"rollout\.max_context_tokens must be a positive"):
            ContextCapped(policy, bad)  # type: ignore[arg-type]
    assert truncation_metrics([True, False, True, False]) == {
        "context_truncated": 2.0,
        "context_truncated_frac": 0.5,
    }
    assert truncation_metrics([]) == {"context_truncated": 0.0, "context_truncated_frac": 0.0}


def test_a_non_binding_cap_samples_the_same_tokens_as_none() -> None:
    """The real tiny policy through the wrapper (its prefix cache included): a cap equal to
    the model's context changes no token, log-prob or record."""
    policy = build_tiny_policy(0)
    tasks = make_tasks("calculator", 2, seed=3)

    def run(cap: int | None) -> list[Any]:
        from turnrl.rollout.tokens import PrefixReuse

        return run_episodes(
            PrefixReuse(cap_context(policy, cap)),
            lambda: make_env("calculator"),
            tasks,
            group_size=2,
            max_new_tokens=M,
            temperature=1.0,
            seed=5,
        ).records

    assert run(policy.max_context) == run(None)


# ---------------------------------------------------------------------- config checks


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", "rollout.max_context_tokens: must be >= 0, got -1"),
        ("12", "rollout.max_context_tokens: 12 leaves no room for a prompt beside a response"),
        ("4097", "rollout.max_context_tokens: 4097 is more than the 4096-position context"),
    ],
)
def test_bad_caps_are_refused_naming_the_field(
    tiny_train: Any, tmp_path: Path, value: str, message: str
) -> None:
    from turnrl.train.validate import validate

    config = tiny_train(tmp_path / "run", f"rollout.max_context_tokens={value}")
    with pytest.raises(ConfigError) as caught:
        validate(config)
    assert message in str(caught.value)


def test_a_cap_at_the_model_context_is_accepted(tiny_train: Any, tmp_path: Path) -> None:
    from turnrl.train.validate import validate

    validate(tiny_train(tmp_path / "run", "rollout.max_context_tokens=4096"))


# ------------------------------------------------------------------- training runs


def _rollout_log(run: Path, step: int) -> dict[str, list[dict[str, Any]]]:
    by_traj: dict[str, list[dict[str, Any]]] = {}
    path = run / "rollouts" / f"step-{step:06d}.jsonl"
    for line in path.read_text().splitlines():
        row = json.loads(line)
        by_traj.setdefault(row["traj_id"], []).append(row)
    return by_traj


def test_a_training_step_counts_its_truncated_episodes(
    tiny_train: Any, tmp_path: Path, read_metrics: Any
) -> None:
    from turnrl.train.online.trainer import OnlineTrainer

    cap = 100  # the calculator's first prompts (~80 tokens) + 12 fit; a second turn never
    config = tiny_train(
        tmp_path / "run",
        f"rollout.max_context_tokens={cap}",
        "warm_start.steps=0",
        "train.steps=2",
        "train.log_rollouts_every=1",
        "train.eval_every=0",
    )
    run = OnlineTrainer(config, quiet=True).run()
    rows = read_metrics(run)
    for row in rows[1:]:
        step = row["step"]
        trajectories = _rollout_log(run, step)
        assert len(trajectories) == row["episodes"] == 4  # every episode took a turn
        for turns in trajectories.values():
            assert all(len(t["prompt_ids"]) + 12 <= cap for t in turns)
        # an episode the cap cut ends on a turn that is not done
        cut = sum(not turns[-1]["done"] for turns in trajectories.values())
        assert cut > 0
        assert row["context_truncated"] == cut
        assert row["context_truncated_frac"] == cut / 4
        assert row["update_tokens_rows"] > 0  # the step updated on the turns kept
    assert "context_truncated" not in rows[0]  # the evaluation row


def test_a_cap_no_first_turn_fits_stops_with_one_line(tiny_train: Any, tmp_path: Path) -> None:
    from turnrl.train.online.trainer import OnlineTrainer

    config = tiny_train(
        tmp_path / "run",
        "rollout.max_context_tokens=40",
        "warm_start.steps=0",
        "train.steps=1",
        "train.eval_every=0",
    )
    with pytest.raises(ConfigError, match=r"rollout\.max_context_tokens: 40 leaves no room for"):
        OnlineTrainer(config, quiet=True).run()


def test_unset_gives_the_records_and_metrics_of_a_run_without_the_field(
    tiny_train: Any, tmp_path: Path, read_metrics: Any
) -> None:
    """A run with the field absent, and one with a cap that never binds (the model's whole
    context): the same turn records, and the same metrics but the count."""
    from turnrl.train.online.trainer import OnlineTrainer

    common = (*PARITY, "train.steps=2", "train.log_rollouts_every=1", "train.eval_every=0")
    runs = {}
    for name, extra in (("absent", ()), ("whole", ("rollout.max_context_tokens=4096",))):
        config = tiny_train(tmp_path / name, *common, *extra)
        runs[name] = OnlineTrainer(config, quiet=True).run()
    for step in (1, 2):
        name = f"step-{step:06d}.jsonl"
        absent = (runs["absent"] / "rollouts" / name).read_text()
        assert absent and absent == (runs["whole"] / "rollouts" / name).read_text()
    absent_rows, whole_rows = read_metrics(runs["absent"]), read_metrics(runs["whole"])
    assert all("context_truncated" not in row for row in absent_rows)
    assert [row.pop("context_truncated") for row in whole_rows[1:]] == [0.0, 0.0]
    assert [row.pop("context_truncated_frac") for row in whole_rows[1:]] == [0.0, 0.0]
    assert absent_rows == whole_rows


def test_ray_workers_build_their_policy_with_the_cap(
    tiny_train: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from turnrl.integrations import ray_workers

    built: list[Any] = []
    monkeypatch.setattr(ray_workers, "RayRolloutPool", lambda factory, *a, **k: factory)
    policy = ToolCaller(max_context=4096)
    for cap, expected in ((0, 4096), (300, 300)):
        config = tiny_train(tmp_path / "run", f"rollout.max_context_tokens={cap}")
        factory = ray_workers.pool_for_config(config, policy_factory=lambda: policy)
        built.append(factory())
        assert built[-1].max_context == expected
    assert built[0] is policy  # unset: the worker's own policy, unwrapped


# ------------------------------------------------------------------------- gateway


def _request(*turns: str, max_tokens: int = 8) -> Any:
    """A chat request: user ``turns[0]``, then (assistant ``ok``, user ``turns[k]``)..."""
    messages: list[dict[str, str]] = [{"role": "user", "content": turns[0]}]
    for text in turns[1:]:
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": text}]
    return parse_chat_request({"model": "m", "messages": messages, "max_tokens": max_tokens})


@pytest.fixture(scope="module")
def tiny() -> HFPolicy:
    return build_tiny_policy(0)


def _gateway(tiny: HFPolicy, cap: int | None) -> Gateway:
    policy = ScriptedPolicy(tiny, lambda context: "ok")
    return Gateway(policy, GatewayConfig(max_context_tokens=cap, batch_window_s=0.001))


def _calls(gateway: Gateway, rollout: str = "r") -> list[dict[str, Any]]:
    """Two calls of a growing conversation, then the reward; the rollout's records."""
    gateway.complete(_request("hi"), rollout)
    gateway.complete(_request("hi", "z" * 60), rollout)
    gateway.reward(rollout, 1.0)
    return [r for r in gateway.views.rollout(rollout)["records"]]


def test_a_call_over_the_cap_is_refused_and_ends_its_rollout_truncated(
    tiny: HFPolicy,
) -> None:
    with _gateway(tiny, None) as plain:
        uncapped = _calls(plain)
    first, second = (len(r["prompt_ids"]) for r in uncapped)
    assert second > first + 60
    # a cap the second call fits exactly: both sampled, the records of no cap
    with _gateway(tiny, second + 8) as roomy:
        assert _calls(roomy) == uncapped
        assert "truncated" not in roomy.views.rollout("r")
    # a cap the first call fits exactly: the second is refused, the rollout ends
    with _gateway(tiny, first + 8) as gateway:
        gateway.complete(_request("hi"), "r")
        with pytest.raises(GatewayError) as caught:
            gateway.complete(_request("hi", "z" * 60), "r")
        error = caught.value
        assert (error.status, error.code) == (400, "context_length_exceeded")
        assert error.param == "messages"
        assert error.message.startswith(
            f"This rollout's maximum context length is {first + 8} tokens (the per-turn "
            f"context cap). However, you requested {second + 8} tokens ({second} in the "
            "messages, 8 in the completion)."
        )
        assert error.body()["error"]["type"] == "invalid_request_error"
        assert gateway.views.rollout("r")["truncated"] == "context"
        # later calls are not sampled, a short one neither
        with pytest.raises(GatewayError) as later:
            gateway.complete(_request("again"), "r")
        assert (later.value.status, later.value.code) == (400, "context_length_exceeded")
        assert "ended at the per-turn context cap" in later.value.message
        summary = gateway.reward("r", 0.5)
        assert (summary["turns"], summary["truncated"]) == (1, "context")
        (finished,) = gateway.views.pop_finished_rollouts()
        assert finished.truncated == "context"
        (record,) = finished.records
        expected = {**uncapped[0], "reward": 0.5, "done": True}
        from turnrl.records import record_to_json

        assert record_to_json(record) == expected


# ---------------------------------------------------------------------- agent loop

FILLER = "a tool result that makes the conversation grow " * 4
"""What the growing agents add to their conversation after every reply (192 characters,
more than the cap of the agent-loop test by itself)."""
AGENT_CAP = 100
"""The agent-loop test's cap: a first call ("Q3?" in the chat template, plus 8 new
tokens) fits; a second, with ``FILLER`` in it, never does."""


def _task_number(task: dict[str, Any]) -> int:
    return int(str(task["task_id"]).rsplit("-", 1)[-1])


def grows_past_the_cap(task: dict[str, Any], llm: Any) -> float:
    """Task 0 and 2: one call. Task 1: calls on with a growing conversation and lets the
    400 of the third call escape (the rollout fails). Task 3: the same, but catches the
    ``context_length_exceeded`` error and returns its reward (the rollout is kept)."""
    client = llm.openai_client()
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    number = _task_number(task)
    for _ in range(1 if number % 2 == 0 else 3):
        try:
            reply = client.chat.completions.create(model=llm.model, messages=messages, max_tokens=8)
        except openai.BadRequestError as error:
            if number == 3 and error.code == "context_length_exceeded":
                return 0.5
            raise
        text = reply.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": FILLER}]
    return 1.0


def test_an_agent_over_the_cap_is_truncated_and_the_step_trains_on_the_rest(
    tmp_path: Path,
) -> None:
    from turnrl.train.agent.loop import AgentTrainer
    from turnrl.train.agent.runner import AT_CONTEXT_CAP
    from turnrl.train.config import RunConfig, load_config

    train, held_out = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    for path, prefix, n in ((train, "t", 4), (held_out, "e", 2)):
        rows = [{"task_id": f"{prefix}-{i}", "question": f"Q{i}?"} for i in range(n)]
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = load_config(
        RunConfig,
        None,
        [
            f"run_dir={tmp_path / 'run'}",
            f"tasks.train={train}",
            f"tasks.eval={held_out}",
            f"agent.entrypoint={Path(__file__).resolve()}:grows_past_the_cap",
            "agent.max_failure_fraction=0",  # a truncated rollout's failure is not counted
            "agent.concurrency=8",
            "agent.timeout_s=60",
            f"rollout.max_context_tokens={AGENT_CAP}",
            "rollout.tasks_per_step=4",  # every task in every step
            "rollout.group_size=2",
            "policy.max_new_tokens=8",
            "warm_start.steps=0",
            "train.steps=1",
            "train.eval_every=0",
            "train.minibatch_size=4",
            "train.threads=1",
        ],
    )
    run = AgentTrainer(config, quiet=True).run()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    step = rows[1]
    assert step["step"] == 1
    # t-1 (x2, failed) and t-3 (x2, kept) ended at the cap; t-0 and t-2 did not
    assert (step["context_truncated"], step["context_truncated_frac"]) == (4.0, 0.5)
    assert (step["agent_failures"], step["episodes"]) == (2.0, 6)
    assert step["env_steps"] == 6  # one call each of t-0, t-2, t-3 (x2): all trained on
    records = [
        json.loads(line)
        for line in (run / "rollouts" / "step-000001.jsonl").read_text().splitlines()
    ]
    by_task: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_task.setdefault(record["task_id"], []).append(record)
    assert sorted(by_task) == ["t-0", "t-2", "t-3"]
    assert [(r["reward"], r["done"]) for r in by_task["t-3"]] == [(0.5, True)] * 2
    assert all(len(r["prompt_ids"]) + 8 <= AGENT_CAP for r in records)
    assert all("advantage" in r for r in records)
    failures = [
        json.loads(line) for line in (run / "agent_failures.jsonl").read_text().splitlines()
    ]
    step_failures = [f for f in failures if f["at"] == "step-000001"]
    assert sorted(f["task_id"] for f in step_failures) == ["t-1", "t-1"]
    assert all(f["reason"].startswith(AT_CONTEXT_CAP) for f in step_failures)
    assert all("BadRequestError" in f["reason"] for f in step_failures)


def test_the_docs_name_the_field_where_fields_are_listed() -> None:
    memory = (REPO / "docs" / "memory.md").read_text()
    assert "rollout.max_context_tokens" in memory and "#3910" in memory
    assert "context_length_exceeded" in (REPO / "docs" / "agents.md").read_text()


def test_the_report_plots_the_share_cut_at_the_cap(tmp_path: Path) -> None:
    from turnrl.report.runs import load_runs
    from turnrl.report.sections import build_sections

    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"step": s, "malformed_rate": 0.1 * s, "context_truncated_frac": 0.25 * s}
        for s in range(1, 4)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sections = build_sections(load_runs([run]), ["malformed_rate", "context_truncated_frac"])
    panels = {p.title: p.metrics for s in sections for p in s.panels}
    assert panels == {
        "Malformed and truncated responses; episodes cut at the context cap": (
            "malformed_rate",
            "context_truncated_frac",
        )
    }


def test_turnrl_serve_takes_the_cap(capsys: pytest.CaptureFixture[str]) -> None:
    from turnrl.cli import build_parser
    from turnrl.serve.cli import gateway_config

    parser = build_parser()
    assert gateway_config(parser.parse_args(["serve"])).max_context_tokens is None
    args = parser.parse_args(["serve", "--max-context-tokens", "512"])
    assert gateway_config(args).max_context_tokens == 512
    for bad, why in (("0", "must be >= 1, got 0"), ("many", "expected a number of tokens")):
        with pytest.raises(SystemExit) as caught:
            parser.parse_args(["serve", "--max-context-tokens", bad])
        assert caught.value.code == 2
        assert why in capsys.readouterr().err


def test_the_async_sampler_samples_under_the_cap() -> None:
    """``train.max_staleness > 0``: the sampler process runs the step's episodes with the
    run's cap, as the learner's own runner would."""
    from turnrl.train.async_sampler import SampleRequest, SamplerSpec, _sample

    task = make_tasks("calculator", 1, seed=0)[0]
    for cap, turns, end in ((0, 10, "env"), (75 + 2 * 27 + M, 3, "context")):
        spec = SamplerSpec(
            policy=None,
            seed=0,
            env_name="calculator",
            env_kwargs={"max_turns": 10},
            max_new_tokens=M,
            temperature=1.0,
            group_size=1,
            prefix_cache=True,
            per_episode_seeds=False,
            max_context_tokens=cap,
        )
        batch = _sample(ToolCaller(), spec, SampleRequest(1, (task,), 0, "s1-"), 3)
        (episode,) = batch.episodes
        assert (episode.turn, episode.end) == (turns, end)
