"""Environments, tools and a registry of built-in environments by name.

``make_env("calculator", max_turns=4)``, ``make_tasks("frozenlake", 100, seed=0)``
and ``demonstration("calculator", task, use_tool=True)`` look environments up in
:data:`ENVS`; :func:`register_env` adds more, and a name ``"module:factory"`` loads a
user's environment (:func:`load_env_spec`). No torch here; gymnasium is
imported only when a FrozenLake environment is used, bm25s only when a lookup
environment searches.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from turnrl.entrypoints import ENTRYPOINT_FORMAT, load_object
from turnrl.envs import calculator, frozenlake, lookup
from turnrl.envs.calculator import CalculatorEnv, calculator_tasks
from turnrl.envs.frozenlake import FrozenLakeEnv, frozenlake_tasks
from turnrl.envs.lookup import LookupEnv, lookup_tasks
from turnrl.envs.tools import (
    FinalAnswer,
    Malformed,
    Tool,
    ToolCall,
    ToolRegistry,
    ToolResult,
    parse_response,
)
from turnrl.errors import ConfigError
from turnrl.types import Env, Message, Task

DemoOptions = Callable[[Task, random.Random, float, float], dict[str, Any]]
"""``(task, rng, tool_fraction, easy_tool_fraction) -> demonstration keyword arguments``."""

DemoVariants = Callable[[Task, float, float], list[tuple[float, dict[str, Any]]]]
"""``(task, tool_fraction, easy_tool_fraction) -> [(probability, demonstration keyword
arguments), ...]``: every demonstration ``DemoOptions`` can draw, with its probability."""


@dataclass(frozen=True)
class EnvSpec:
    """How to build one kind of environment, its tasks, and ideal demonstrations."""

    make_env: Callable[..., Env]
    make_tasks: Callable[..., list[Task]]
    demonstration: Callable[..., list[Message]]
    demo_options: DemoOptions | None = None
    """Draws each task's ``demonstration`` options for the warm-start mix (which
    calculator demonstrations call the tool, which lookup ones make a mistake)
    from the warm start's ``tool_fraction`` and ``easy_tool_fraction``; None: every
    demonstration is the ideal one."""
    demo_variants: DemoVariants | None = None
    """Every option set ``demo_options`` can draw for a task, with its probability: what
    the warm start's ``mix = "per_draw"`` trains on (each task's mixture, not one draw)."""


ENVS: dict[str, EnvSpec] = {}


def register_env(name: str, spec: EnvSpec) -> None:
    """Register an environment under ``name`` (re-registering a name is an error)."""
    if name in ENVS:
        raise ValueError(f"environment {name!r} is already registered")
    ENVS[name] = spec


def get_env_spec(name: str) -> EnvSpec:
    """The spec registered as ``name``, or named by ``name`` = ``"module:factory"`` (see
    :func:`load_env_spec`); unknown names raise ``ValueError`` listing known ones."""
    if name not in ENVS and ENTRYPOINT_FORMAT.match(name.strip()):
        ENVS[name] = load_env_spec(name)
    try:
        return ENVS[name]
    except KeyError:
        raise ValueError(f"unknown environment {name!r}; known: {sorted(ENVS)}") from None


def load_env_spec(spec: str, option: str = "env.name") -> EnvSpec:
    """The :class:`EnvSpec` a user's code names: ``"package.module:factory"`` or
    ``"path/to/file.py:factory"``, where ``factory`` is an ``EnvSpec`` or a function of no
    arguments returning one. An environment then joins a run from the config alone
    (``env.name = "mypkg.envs:make_env"``), as agents do, without editing this module.
    Raises :class:`~turnrl.errors.ConfigError` naming ``option`` when the import fails,
    the factory fails or returns something else."""
    found = load_object(spec, option)
    if isinstance(found, EnvSpec):
        return found
    if not callable(found):
        raise ConfigError(f"{option}: {spec} is neither an EnvSpec nor a function returning one")
    try:
        made = found()
    except Exception as exc:
        raise ConfigError(f"{option}: {spec}() failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(made, EnvSpec):
        raise ConfigError(
            f"{option}: {spec}() must return a turnrl.envs.EnvSpec, got {type(made).__name__}"
        )
    return made


def make_env(name: str, **kwargs: Any) -> Env:
    """A fresh environment ``name`` built with ``kwargs``."""
    return get_env_spec(name).make_env(**kwargs)


def make_tasks(name: str, n: int, seed: int, **kwargs: Any) -> list[Task]:
    """``n`` tasks for environment ``name``, deterministic from ``seed``."""
    return get_env_spec(name).make_tasks(n, seed, **kwargs)


def demonstration(name: str, task: Task, **kwargs: Any) -> list[Message]:
    """The full conversation of an ideal solution of ``task`` (for SFT warm start)."""
    return get_env_spec(name).demonstration(task, **kwargs)


register_env(
    "calculator",
    EnvSpec(
        CalculatorEnv,
        calculator_tasks,
        calculator.demonstration,
        calculator.demo_options,
        calculator.demo_variants,
    ),
)
register_env("frozenlake", EnvSpec(FrozenLakeEnv, frozenlake_tasks, frozenlake.demonstration))
register_env(
    "lookup",
    EnvSpec(
        LookupEnv, lookup_tasks, lookup.demonstration, lookup.demo_options, lookup.demo_variants
    ),
)

from turnrl.envs.negotiation import SETTINGS as _NEGOTIATION  # noqa: E402 (needs EnvSpec above)

for _name, (_env, _tasks, _demo) in _NEGOTIATION.items():
    register_env(_name, EnvSpec(_env, _tasks, _demo))

__all__ = [
    "ENVS",
    "CalculatorEnv",
    "EnvSpec",
    "FinalAnswer",
    "FrozenLakeEnv",
    "LookupEnv",
    "Malformed",
    "Tool",
    "ToolCall",
    "ToolRegistry",
    "ToolResult",
    "calculator_tasks",
    "demonstration",
    "frozenlake_tasks",
    "get_env_spec",
    "load_env_spec",
    "lookup_tasks",
    "make_env",
    "make_tasks",
    "parse_response",
    "register_env",
]
