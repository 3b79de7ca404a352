"""``validate(config)`` and the typed option checks it is built on."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from conftest import REPO
from turnrl.options import TypeMismatch, Unsupported, check_options, coerce
from turnrl.train.config import RunConfig, TrainConfig, load_config
from turnrl.train.iterate.config import IterateConfig
from turnrl.train.validate import ConfigError, Problems, register_check, validate

# --------------------------------------------------------------------------- options


def test_coerce_checks_literals_unions_and_containers() -> None:
    mode = Literal["a", "b"]
    assert coerce("a", mode) == "a"
    with pytest.raises(TypeMismatch, match="expected one of 'a', 'b'; got 'c'"):
        coerce("c", mode)
    with pytest.raises(TypeMismatch):
        coerce(True, Literal[1, 2])  # True == 1, but it is no 1
    assert coerce(1, float | None) == 1.0 and coerce(None, float | None) is None
    assert coerce([1, 2], tuple[float, ...]) == (1.0, 2.0)
    assert coerce({"x": 1}, dict[str, int]) == {"x": 1}
    with pytest.raises(TypeMismatch, match=r"expected an integer, got 1\.5"):
        coerce([1.5], list[int])
    with pytest.raises(Unsupported):
        coerce(1, set[int])


def takes(table: Any, *, gamma: float = 1.0, mode: Literal["x", "y"] = "x", tools=()) -> None:
    """A registered function: its keyword options and their hints."""


def takes_anything(n: int, seed: int, **kwargs: Any) -> None:
    """Accepts any option name."""


def test_check_options_names_unknown_and_mistyped_options() -> None:
    assert check_options(takes, {"gamma": 0.5, "mode": "y", "tools": [object()]}, skip=1) == []
    problems = dict(check_options(takes, {"gama": 1, "gamma": "abc", "mode": "z"}, skip=1))
    assert problems["gama"].startswith("unknown option; allowed: gamma=1.0, mode='x', tools")
    assert problems["gamma"] == "expected a number, got 'abc'"
    assert problems["mode"] == "expected one of 'x', 'y'; got 'z'"
    assert check_options(takes_anything, {"whatever": 1}, skip=2) == []
    assert dict(check_options(takes, {"table": 1}, skip=1)) == {
        "table": "unknown option; allowed: gamma=1.0, mode='x', tools"
    }


# --------------------------------------------------------------------------- validate


@pytest.mark.parametrize("path", sorted((REPO / "examples").rglob("*.toml")), ids=str)
def test_every_example_config_is_valid(path: Path) -> None:
    cls = IterateConfig if path.name.startswith("iterate") else RunConfig
    validate(load_config(cls, path), toml_path=path)


def test_configs_built_in_code_are_type_checked_too() -> None:
    config = RunConfig(train=TrainConfig(aggregation="mean", minibatch_size="64"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as error:
        validate(config)
    assert dict(error.value.problems) == {
        "train.minibatch_size": "expected an integer, got '64'",
        "train.aggregation": "expected one of 'token-mean', 'seq-mean-token-mean', "
        "'rollout-mean', 'legacy-verl'; got 'mean'",
    }


def test_all_problems_are_reported_with_where_they_came_from(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text("[train]\nsteps = -1\n\n[credit]\nestimator = 'grpo'\nparams = {gama = 1}\n")
    overrides = ["train.keep_checkpoints=0"]
    config = load_config(RunConfig, toml, overrides)
    with pytest.raises(ConfigError) as error:
        validate(config, toml_path=toml, overrides=overrides)
    text = str(error.value)
    assert text.startswith("3 config errors:")
    assert f"{toml}:2: train.steps: must be >= 0, got -1" in text
    assert f"{toml}:6: credit.params.gama: unknown option; allowed: use_std=True" in text
    assert "override 'train.keep_checkpoints=0': train.keep_checkpoints: must be >= 1" in text


def test_iterate_sections_are_checked() -> None:
    config = load_config(
        IterateConfig,
        None,
        [
            "env.n_train_tasks=4",
            "deploy.tasks_per_iteration=5",
            "deploy.personas=[]",
            "q.holdout_fraction=1.0",
            "improve.temperature=0",
            "improve.minibatch_size=0",
            'warm_start.persona_styles={ "Be hard." = "fierce" }',
        ],
    )
    with pytest.raises(ConfigError) as error:
        validate(config)
    assert set(dict(error.value.problems)) == {
        "deploy.tasks_per_iteration",
        "deploy.personas",
        "q.holdout_fraction",
        "improve.temperature",
        "improve.minibatch_size",
        "warm_start.persona_styles['Be hard.']",
    }
    # no environment (logs only): the environment's checks do not apply
    validate(load_config(IterateConfig, None, ["env.name=", "env.n_train_tasks=0"]))


@dataclass
class AgentSection:
    """A section another trainer adds (the agent loop's ``[agent]``)."""

    concurrency: int = 4
    entrypoint: str = ""


@dataclass
class AgentRun:
    run_dir: str = "runs/agent"
    agent: AgentSection = field(default_factory=AgentSection)
    train: TrainConfig = field(default_factory=TrainConfig)


@register_check(AgentSection)
def _agent(section: AgentSection, problems: Problems) -> None:
    problems.at_least("concurrency", section.concurrency, 1)
    if ":" not in section.entrypoint:
        problems.add("entrypoint", "expected 'package.module:function'")


def test_new_sections_register_their_checks() -> None:
    config = AgentRun(agent=AgentSection(concurrency=0), train=TrainConfig(epochs=0))
    with pytest.raises(ConfigError) as error:
        validate(config)
    assert error.value.problems == [
        ("agent.concurrency", "must be >= 1, got 0"),
        ("agent.entrypoint", "expected 'package.module:function'"),
        ("train.epochs", "must be >= 1, got 0"),  # the PPO checks come with TrainConfig
    ]
    validate(AgentRun(agent=AgentSection(entrypoint="pkg.mod:run")))


def test_task_values_the_generator_refuses_are_config_errors() -> None:
    config = load_config(RunConfig, None, ["env.task_kwargs={hard_operands=[999, 317]}"])
    with pytest.raises(ConfigError) as error:
        validate(config, overrides=["env.task_kwargs={hard_operands=[999, 317]}"])
    ((key, message),) = error.value.problems
    assert key == "env.task_kwargs"
    assert "1 <= hard_operands[0] <= hard_operands[1]" in message
    assert "override 'env.task_kwargs={hard_operands=[999, 317]}'" in str(error.value)
