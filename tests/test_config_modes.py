"""One mode per run: an ``[agent]`` program's run refuses ``[env]``, an environment run
refuses ``[agent]`` and ``[tasks]`` (in the file, an override, or code), and a saved
config holds only the run's own sections. Each section checks its own fields."""

from __future__ import annotations

import dataclasses
import itertools
import json
import tomllib
from pathlib import Path

import pytest

from turnrl.errors import ConfigError
from turnrl.train.config import (
    AgentConfig,
    PPOConfig,
    RunConfig,
    TasksConfig,
    TrainConfig,
    config_to_toml_text,
    load_config,
)
from turnrl.train.run import RunDirectory
from turnrl.train.validate import Problems, validate

ENTRYPOINT = 'entrypoint = "my_agents.calc:run"'
ENV_REFUSED = (
    "[env] is for built-in environment runs; an [agent] program's tasks come from [tasks] "
    "(remove the [env] section)"
)


def _agent_or_tasks_refused(name: str) -> str:
    return (
        f"[{name}] is for agent programs, and agent.entrypoint and agent.command are unset "
        f"(set one of them, or remove the [{name}] section: this run trains on [env])"
    )


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_an_agent_run_refuses_an_env_section_naming_file_line_and_field(tmp_path: Path) -> None:
    path = _write(tmp_path, f'[agent]\n{ENTRYPOINT}\n\n[env]\nname = "lookup"\n')
    with pytest.raises(ConfigError) as error:
        load_config(RunConfig, path)
    assert str(error.value) == f"{path}:5: env.name: {ENV_REFUSED}"


def test_an_empty_section_of_the_other_mode_is_refused_at_its_header(tmp_path: Path) -> None:
    path = _write(tmp_path, f"[env]\n\n[agent]\n{ENTRYPOINT}\n")
    with pytest.raises(ConfigError) as error:
        load_config(RunConfig, path)
    assert str(error.value) == f"{path}:1: env: {ENV_REFUSED}"


def test_an_env_run_refuses_tasks_and_agent_settings_without_a_program(tmp_path: Path) -> None:
    path = _write(tmp_path, '[env]\nname = "calculator"\n\n[tasks]\nn_train = 8\n')
    with pytest.raises(ConfigError) as error:
        load_config(RunConfig, path)
    assert str(error.value) == f"{path}:5: tasks.n_train: {_agent_or_tasks_refused('tasks')}"
    path = _write(tmp_path, "[agent]\nconcurrency = 4\n")
    with pytest.raises(ConfigError) as error:
        load_config(RunConfig, path)
    assert str(error.value) == f"{path}:2: agent.concurrency: {_agent_or_tasks_refused('agent')}"


def test_overrides_of_the_other_mode_name_the_override(tmp_path: Path) -> None:
    path = _write(tmp_path, f"[agent]\n{ENTRYPOINT}\n")
    with pytest.raises(ConfigError) as error:
        load_config(RunConfig, path, ["train.steps=3", "env.name=lookup"])
    assert str(error.value) == f"override 'env.name=lookup': env.name: {ENV_REFUSED}"
    with pytest.raises(ConfigError) as error:
        load_config(RunConfig, None, ["tasks.n_eval=3"])
    assert str(error.value) == (
        f"override 'tasks.n_eval=3': tasks.n_eval: {_agent_or_tasks_refused('tasks')}"
    )
    # the mode is decided after every override: a program given as an override allows
    # [tasks] in the file, and an override that sets the program allows tasks.* overrides
    path = _write(tmp_path, "[tasks]\nn_train = 8\n")
    config = load_config(RunConfig, path, ["agent.entrypoint=my_agents.calc:run", "tasks.n_eval=3"])
    assert (config.mode, config.tasks.n_train, config.tasks.n_eval) == ("agent", 8, 3)


@pytest.mark.parametrize(
    ("program", "sections"),
    [
        (program, sections)
        for program in (False, True)
        for size in range(3)
        for sections in itertools.combinations(("env", "tasks", "agent"), size)
    ],
)
def test_a_file_is_refused_exactly_when_it_sets_a_section_of_the_other_mode(
    tmp_path: Path, program: bool, sections: tuple[str, ...]
) -> None:
    """Every combination of mode and sections: refused iff a section is the other mode's."""
    body = {
        "env": "[env]\nn_train_tasks = 64\n",
        "tasks": "[tasks]\nn_train = 16\n",
        "agent": "[agent]\nconcurrency = 2\n" + (f"{ENTRYPOINT}\n" if program else ""),
    }
    if program and "agent" not in sections:
        sections = (*sections, "agent")
    path = _write(tmp_path, "\n".join(body[name] for name in sections))
    other_mode = {"env"} if program else {"agent", "tasks"}
    if other_mode & set(sections):
        with pytest.raises(ConfigError, match="is for"):
            load_config(RunConfig, path)
    else:
        config = load_config(RunConfig, path)
        assert config.mode == ("agent" if program else "env")
        assert ("env" in sections) == (config.env.n_train_tasks == 64)
        assert ("tasks" in sections) == (config.tasks.n_train == 16)


def test_a_saved_config_holds_only_its_modes_sections(tmp_path: Path) -> None:
    env_run = load_config(RunConfig, None, ["env.n_train_tasks=32"])
    env_text = config_to_toml_text(env_run)
    assert sorted(tomllib.loads(env_text)) == [
        "credit",
        "env",
        "logging",
        "policy",
        "rollout",
        "run_dir",
        "train",
        "warm_start",
    ]
    assert load_config(RunConfig, _write(tmp_path, env_text)) == env_run

    agent_run = load_config(
        RunConfig, None, ["agent.entrypoint=my_agents.calc:run", "tasks.n_train=16"]
    )
    agent_text = config_to_toml_text(agent_run)
    assert sorted(tomllib.loads(agent_text)) == [
        "agent",
        "credit",
        "logging",
        "policy",
        "rollout",
        "run_dir",
        "tasks",
        "train",
        "warm_start",
    ]
    assert load_config(RunConfig, _write(tmp_path, agent_text)) == agent_run


def test_a_config_built_in_code_is_checked_for_its_mode_too() -> None:
    agent_run = RunConfig(agent=AgentConfig(entrypoint="my_agents.calc:run"))
    agent_run.env.n_train_tasks = 5
    with pytest.raises(ConfigError) as error:
        validate(agent_run)
    assert error.value.problems == [("env.n_train_tasks", ENV_REFUSED)]

    env_run = RunConfig(tasks=TasksConfig(n_eval=3), agent=AgentConfig(concurrency=2))
    with pytest.raises(ConfigError) as error:
        validate(env_run)
    assert error.value.problems == [
        ("agent.concurrency", _agent_or_tasks_refused("agent")),
        ("tasks.n_eval", _agent_or_tasks_refused("tasks")),
    ]
    validate(RunConfig(agent=AgentConfig(entrypoint="my_agents.calc:run")))
    validate(RunConfig())


def test_a_section_checks_its_own_fields() -> None:
    problems = Problems("improve.")
    PPOConfig(lr=0.0, epochs=0).check(problems)
    assert problems.found == [
        ("improve.lr", "must be > 0, got 0.0"),
        ("improve.epochs", "must be >= 1, got 0"),
    ]
    problems = Problems("train.")
    TrainConfig(steps=-1, minibatch_size=0).check(problems)  # its own, then PPOConfig's
    assert problems.found == [
        ("train.steps", "must be >= 0, got -1"),
        ("train.minibatch_size", "must be >= 1, got 0"),
    ]
    problems = Problems("agent.")
    AgentConfig(entrypoint="no_colon", command=["x"], port=70000).check(problems)
    assert problems.found == [
        ("agent.command", "set exactly one of agent.entrypoint and agent.command, not both"),
        (
            "agent.entrypoint",
            "expected 'package.module:function' or 'path/to/file.py:function', got 'no_colon'",
        ),
        ("agent.port", "must be in [0, 65535], got 70000"),
    ]


def _every_section_text(config: RunConfig) -> str:
    """A config copy as turnrl saved it before runs had one mode: every section."""
    text = config_to_toml_text(config)
    for name in ("agent", "tasks", "env"):
        section = getattr(config, name)
        if f"[{name}]" not in text:
            text += f"\n[{name}]\n" + "".join(
                f"{key} = {json.dumps(value)}\n"
                for key, value in dataclasses.asdict(section).items()
                if value is not None
            )
    return text


def test_a_run_saved_with_every_section_still_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = load_config(RunConfig, None, [f"run_dir={run_dir}", "train.steps=2"])
    run_dir.mkdir()
    saved = run_dir / "config.toml"
    saved.write_text(_every_section_text(config), encoding="utf-8")
    assert "[agent]" in saved.read_text() and "[tasks]" in saved.read_text()
    with pytest.raises(ConfigError, match=r"config.toml:\d+: agent\.\w+: \[agent\] is for"):
        load_config(RunConfig, saved)  # as a user's config: refused
    assert load_config(RunConfig, saved, saved_copy=True) == config
    assert RunDirectory.open(config, resume=True).resuming

    # a saved copy whose other-mode section holds anything but its defaults: refused
    saved.write_text(saved.read_text().replace("concurrency = 16", "concurrency = 4"))
    with pytest.raises(ConfigError, match=r"config.toml:\d+: agent\.\w+: \[agent\] is for"):
        load_config(RunConfig, saved, saved_copy=True)
