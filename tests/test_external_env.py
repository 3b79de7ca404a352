"""A user's environment named in a config as ``module:factory`` (here, defined in this
test module), as agents are: no edit of ``turnrl.envs``; a failing import or factory is
a config error located in the file (line) and naming ``env.name``."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import ParityEnv, parity_demonstration, parity_tasks
from turnrl.envs import ENVS, EnvSpec, get_env_spec, make_env, make_tasks
from turnrl.errors import ConfigError
from turnrl.train.config import RunConfig, load_config
from turnrl.train.online.trainer import OnlineTrainer
from turnrl.train.validate import validate

NAME = "test_external_env:parity_spec"


def parity_spec() -> EnvSpec:
    """The factory a config names: the parity environment of conftest, not registered."""
    return EnvSpec(ParityEnv, parity_tasks, parity_demonstration)


SPEC = parity_spec()
"""An ``EnvSpec`` itself may be named too."""


def failing_factory() -> EnvSpec:
    raise RuntimeError("no such dataset")


def not_a_factory() -> int:
    return 3


@pytest.fixture(autouse=True)
def _forget_loaded_envs():
    """Each test loads the names it uses itself (loading caches them in ``ENVS``)."""
    before = dict(ENVS)
    yield
    ENVS.clear()
    ENVS.update(before)


def test_a_module_factory_name_builds_envs_tasks_and_demonstrations() -> None:
    assert NAME not in ENVS
    spec = get_env_spec(NAME)
    assert spec.make_env is ParityEnv
    env = make_env(NAME)
    tasks = make_tasks(NAME, 3, seed=4)
    assert [t.task_id for t in tasks] == ["p4-0", "p4-1", "p4-2"]
    assert env.reset(tasks[1])[-1] == {"role": "user", "content": "task 1"}
    assert get_env_spec("test_external_env:SPEC") is SPEC


def _validate(tmp_path: Path, name: str) -> str:
    toml = tmp_path / "run.toml"
    toml.write_text(f"[env]\nname = '{name}'\nenv_kwargs = {{}}\ntask_kwargs = {{}}\n")
    config = load_config(RunConfig, toml, ["warm_start.steps=0"])
    with pytest.raises(ConfigError) as error:
        validate(config, toml_path=toml)
    return str(error.value)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("no_such_module_xyz:make_env", "cannot import 'no_such_module_xyz': ModuleNotFoundError"),
        ("test_external_env:missing", "test_external_env has no attribute 'missing'"),
        (
            "test_external_env:failing_factory",
            "test_external_env:failing_factory() failed: RuntimeError: no such dataset",
        ),
        (
            "test_external_env:not_a_factory",
            "test_external_env:not_a_factory() must return a turnrl.envs.EnvSpec, got int",
        ),
        ("test_external_env:NAME", "test_external_env:NAME is neither an EnvSpec nor a function"),
    ],
)
def test_a_failing_import_or_factory_is_a_located_config_error(
    tmp_path: Path, name: str, problem: str
) -> None:
    text = _validate(tmp_path, name)
    assert text.startswith(f"config error: {tmp_path / 'run.toml'}:2: env.name: {problem}"), text
    assert name not in ENVS


def test_a_run_trains_on_the_named_environment(tmp_path: Path, tiny_train, read_metrics) -> None:
    config = tiny_train(
        tmp_path,
        f"env.name={NAME}",
        "env.env_kwargs={}",
        "env.task_kwargs={}",
        "warm_start.steps=0",
        "train.steps=1",
        "train.eval_every=1",
    )
    validate(config)
    run = OnlineTrainer(config, quiet=True).run()
    text = (run / "config.toml").read_text()
    assert f'name = "{NAME}"' in text
    assert [row["step"] for row in read_metrics(run) if "pg_loss" in row] == [1]
