"""The warm start's demonstration mix: per task (one draw) or per draw (every variant,
weighted), weighted batch sampling and the learning-rate schedule."""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from turnrl.envs import calculator, get_env_spec, lookup
from turnrl.envs.calculator import make_task
from turnrl.errors import ConfigError
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.train.config import RunConfig, load_config
from turnrl.train.update.sft import (
    batch_indices,
    demonstration_examples,
    lr_factor,
    supervised_warm_start,
)
from turnrl.train.validate import validate


@pytest.fixture(scope="module")
def tiny_policy() -> HFPolicy:
    return build_tiny_policy(seed=0)


HARD = make_task(123, "*", 456, tags=("hard",))
EASY = make_task(7, "+", 2, tags=("easy",))


def test_calculator_variants_are_the_two_demonstrations_with_their_shares() -> None:
    assert calculator.demo_variants(HARD, 0.3, 0.5) == [
        (0.3, {"use_tool": True}),
        (0.7, {"use_tool": False}),
    ]
    assert calculator.demo_variants(EASY, 0.3, 0.5) == [
        (0.5, {"use_tool": True}),
        (0.5, {"use_tool": False}),
    ]
    assert calculator.demo_variants(EASY, 0.3, 0.0) == [(1.0, {"use_tool": False})]
    assert get_env_spec("calculator").demo_variants is calculator.demo_variants


@settings(max_examples=30, deadline=None)
@given(
    tool_fraction=st.floats(0.0, 1.0),
    seed=st.integers(0, 10_000),
)
def test_lookup_variants_sum_to_one_and_cover_every_draw(tool_fraction: float, seed: int) -> None:
    tasks = lookup.lookup_tasks(12, seed)
    rng = random.Random(seed)
    for task in tasks:
        variants = lookup.demo_variants(task, tool_fraction, 0.0)
        assert math.isclose(sum(p for p, _ in variants), 1.0)
        assert all(p > 0 for p, _ in variants)
        options = [kwargs for _, kwargs in variants]
        for _ in range(20):
            assert lookup.demo_options(task, rng, tool_fraction, 0.0) in options


def test_lookup_variant_shares_match_the_draws() -> None:
    """Over many draws, ``demo_options`` picks each variant about as often as its share."""
    task = next(
        t
        for t in lookup.lookup_tasks(200, 0)
        if t.payload["chain"][0] == "mentor" and len(t.payload["chain"]) == 3
    )
    rng = random.Random(1)
    draws = 20_000
    counts = Counter(
        tuple(sorted(lookup.demo_options(task, rng, 0.4, 0.0).items())) for _ in range(draws)
    )
    for share, kwargs in lookup.demo_variants(task, 0.4, 0.0):
        observed = counts[tuple(sorted(kwargs.items()))] / draws
        assert abs(observed - share) < 4 * math.sqrt(share * (1 - share) / draws), kwargs
    assert [share for share, _ in lookup.demo_variants(task, 0.4, 0.0)] == pytest.approx(
        [0.4, 0.3, 0.1, 0.1, 0.1]
    )


def _hard_and_easy(policy: HFPolicy, tool_fraction: float) -> list:
    """Per-draw examples of HARD and EASY (easy tasks use the tool half the time)."""
    return demonstration_examples(
        policy,
        "calculator",
        [HARD, EASY],
        seed=0,
        tool_fraction=tool_fraction,
        easy_tool_fraction=0.5,
        mix="per_draw",
    )


def test_per_draw_keeps_every_variant_weighted_by_its_share(tiny_policy) -> None:
    examples = _hard_and_easy(tiny_policy, tool_fraction=0.25)
    # hard: tool conversation (call, answer) at 0.25 each, direct answer at 0.75; easy: 0.5s
    assert [e.weight for e in examples] == [0.25, 0.25, 0.75, 0.5, 0.5, 0.5]
    first_turns = [e for e in examples if e.context == examples[0].context]
    assert [e.weight for e in first_turns] == [0.25, 0.75]
    call, direct = (tiny_policy.tokenizer.decode(e.response[:-1]) for e in first_turns)
    assert call == "<call>123*456</call>"
    assert direct == "<answer>56088</answer>"


def test_per_task_draws_one_demonstration_per_task_unweighted(tiny_policy) -> None:
    examples = demonstration_examples(
        tiny_policy,
        "calculator",
        [HARD] * 40,
        seed=3,
        tool_fraction=0.25,
        easy_tool_fraction=0.0,
    )
    assert {e.weight for e in examples} == {1.0}
    rng = random.Random(3)
    expected_rows = sum(2 if rng.random() < 0.25 else 1 for _ in range(40))
    assert len(examples) == expected_rows


def test_per_draw_on_an_env_without_options_is_the_ideal_demonstration(tiny_policy) -> None:
    tasks = get_env_spec("frozenlake").make_tasks(3, 0)
    per_task = demonstration_examples(
        tiny_policy, "frozenlake", tasks, seed=0, tool_fraction=0.5, easy_tool_fraction=0.0
    )
    per_draw = demonstration_examples(
        tiny_policy,
        "frozenlake",
        tasks,
        seed=0,
        tool_fraction=0.5,
        easy_tool_fraction=0.0,
        mix="per_draw",
    )
    assert per_draw == per_task


def test_unknown_mix_is_refused(tiny_policy) -> None:
    with pytest.raises(ValueError, match="per_task"):
        demonstration_examples(
            tiny_policy,
            "calculator",
            [HARD],
            seed=0,
            tool_fraction=0.5,
            easy_tool_fraction=0.0,
            mix="sometimes",
        )


def test_batch_indices_follow_the_weights() -> None:
    generator = torch.Generator().manual_seed(0)
    assert set(batch_indices([0.0, 2.0, 0.0, 1.0], 500, generator)) == {1, 3}
    counts = Counter(batch_indices([0.0, 3.0, 0.0, 1.0], 8000, generator))
    assert abs(counts[1] / 8000 - 0.75) < 4 * math.sqrt(0.75 * 0.25 / 8000)


def test_equal_weights_draw_the_uniform_stream_of_earlier_warm_starts() -> None:
    drawn = batch_indices([0.5] * 7, 32, torch.Generator().manual_seed(11))
    assert drawn == torch.randint(7, (32,), generator=torch.Generator().manual_seed(11)).tolist()


def test_lr_factor() -> None:
    assert [lr_factor("constant", i, 4) for i in range(4)] == [1.0] * 4
    assert [lr_factor("cosine", i, 4) for i in range(4)] == pytest.approx(
        [1.0, 0.8535533905932737, 0.5, 0.14644660940567782]
    )
    with pytest.raises(ValueError, match="cosine"):
        lr_factor("linear", 0, 4)


def test_cosine_warm_start_sets_each_steps_rate(tiny_policy, monkeypatch) -> None:
    """The optimiser's rate at each step is ``lr`` times the schedule's factor."""
    rates: list[float] = []
    original = torch.optim.AdamW.step

    def spy(self, *args, **kwargs):
        rates.append(self.param_groups[0]["lr"])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", spy)
    examples = _hard_and_easy(tiny_policy, tool_fraction=0.5)
    supervised_warm_start(
        tiny_policy, examples, steps=4, lr=0.01, batch_size=2, seed=0, lr_schedule="cosine"
    )
    assert rates == pytest.approx([0.01 * lr_factor("cosine", i, 4) for i in range(4)])


def _problems(run_dir: Path, *overrides: str) -> list[str]:
    """The keys ``validate`` names for the default config with ``overrides``."""
    try:
        validate(load_config(RunConfig, None, [f"run_dir={run_dir}", *overrides]))
    except ConfigError as error:  # validate's (a list of problems) or the loader's (one)
        return [key for key, _ in getattr(error, "problems", [])] or [str(error)]
    return []


def test_config_refuses_per_draw_without_variants(tmp_path: Path) -> None:
    from turnrl.envs import ENVS, EnvSpec, register_env

    if "options-only" not in ENVS:
        spec = get_env_spec("calculator")
        register_env(
            "options-only",
            EnvSpec(spec.make_env, spec.make_tasks, spec.demonstration, spec.demo_options),
        )
    assert "warm_start.mix" in _problems(
        tmp_path, "env.name=options-only", "warm_start.mix=per_draw"
    )
    assert "warm_start.mix" not in _problems(tmp_path, "warm_start.mix=per_draw")
    assert (
        "warm_start.mix: expected one of 'per_task', 'per_draw'"
        in _problems(tmp_path, "warm_start.mix=always")[0]
    )
    assert (
        "warm_start.lr_schedule: expected one of"
        in _problems(tmp_path, "warm_start.lr_schedule=linear")[0]
    )
    # an agent's per_draw runs its teacher once per variant of tasks.train's environment
    # (turnrl.train.agent.teacher_mix): refused where that environment lists none
    agent = (
        "agent.entrypoint=examples.agents.calc_openai:run",
        "warm_start.teacher=examples/agents/calc_teacher.py:teach",
        "warm_start.mix=per_draw",
    )
    assert "warm_start.mix" in _problems(tmp_path, *agent, "tasks.train=options-only")
    assert "warm_start.mix" not in _problems(tmp_path, *agent, "tasks.train=calculator")


def _sequence_logprob(policy: HFPolicy, context: list[int], ids: list[int]) -> float:
    """log P(ids | context) by one plain forward over context + ids."""
    with torch.no_grad():
        logits = policy.model(torch.tensor([context + ids])).logits[0]
    logp = logits.log_softmax(-1)
    return sum(float(logp[len(context) - 1 + i, t]) for i, t in enumerate(ids))


def test_per_draw_cosine_run_and_its_tool_probabilities(tmp_path: Path, tiny_train, capsys):
    """A tiny run with the demo's warm-start options, then examples/tool_probability.py
    on it: P(call) per task agrees with a plain forward of both openings."""
    import importlib.util

    from turnrl.envs import make_env
    from turnrl.train.online.trainer import OnlineTrainer
    from turnrl.train.run import task_split

    config = tiny_train(
        tmp_path / "run",
        "warm_start.mix=per_draw",
        "warm_start.lr_schedule=cosine",
        "train.steps=0",
    )
    OnlineTrainer(config, quiet=True).run()
    losses = (tmp_path / "run" / "warm_start_losses.json").read_text()
    assert len(losses.split(",")) == config.warm_start.steps

    spec = importlib.util.spec_from_file_location(
        "tool_probability", Path(__file__).parents[1] / "examples" / "tool_probability.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    policy = HFPolicy.from_pretrained(tmp_path / "run" / "warm_start")
    policy.model.eval()
    tasks = task_split(config.env).eval
    probabilities = module.tool_probabilities(policy, config, tasks)
    env = make_env(config.env.name, **config.env.env_kwargs)
    for task, p in zip(tasks, probabilities, strict=True):
        context = policy.encode_initial(env.reset(task))
        call = _sequence_logprob(policy, context, module._ids(policy, "<call>"))
        answer = _sequence_logprob(policy, context, module._ids(policy, "<answer>"))
        assert p == pytest.approx(1 / (1 + math.exp(answer - call)), abs=1e-5)
    module.main([str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert "mix = 'per_draw'" in out and "held-out  n=  4" in out
