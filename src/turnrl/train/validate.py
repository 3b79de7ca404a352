"""``validate(config)``: every config error of a run, found before any work or file.

One walk over the config tree (``RunConfig`` of ``turnrl train``, ``IterateConfig``
of ``turnrl iterate``, and any section a trainer adds): every field's value is
checked against its type hint (``Literal`` enums name their allowed values), then
the checks registered for each section's class run. Registered names are resolved
against their registries and their option tables against the registered function's
signature (estimators, rollout strategies, environments and task generators), so a
misspelt name or option, or a value of the wrong type, is refused with the allowed
ones named, not found after the warm start.

Every problem names its dotted key (``train.minibatch_size``); all problems of a
config are reported together in one :class:`~turnrl.errors.ConfigError` (its
``problems`` holds them as ``(dotted key, message)`` pairs).

A new section (the agent loop's ``[agent]``) registers its checks with::

    @register_check(AgentConfig)
    def _agent(section: AgentConfig, problems: Problems) -> None:
        problems.at_least("concurrency", section.concurrency, 1)

Checks of a section class also run on its subclasses (``ImproveConfig`` gets the
``PPOConfig`` checks). Checks registered on the top-level class see the whole config
and report keys relative to the top (``rollout.tasks_per_step``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from turnrl.errors import ConfigError
from turnrl.options import check_options, fits
from turnrl.train.config import (
    AgentConfig,
    CreditConfig,
    EnvConfig,
    PolicyConfig,
    PPOConfig,
    RolloutConfig,
    RunConfig,
    TasksConfig,
    TrainConfig,
    WarmStartConfig,
    config_origin,
)
from turnrl.train.iterate.config import (
    DeployConfig,
    ImproveConfig,
    IterateConfig,
    IterateEvalConfig,
    IterateWarmStartConfig,
    QConfig,
)

C = TypeVar("C")


class Problems:
    """Collects the problems of one section, keys prefixed with the section's path."""

    def __init__(self, prefix: str = "", found: list[tuple[str, str]] | None = None) -> None:
        self.prefix = prefix
        self.found: list[tuple[str, str]] = [] if found is None else found

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def add(self, name: str, message: str) -> None:
        """Report ``message`` about field ``name`` of this section."""
        self.found.append((self.key(name), message))

    def at_least(self, name: str, value: float, minimum: float) -> None:
        """``value >= minimum`` (NaN fails)."""
        if not value >= minimum:
            self.add(name, f"must be >= {minimum}, got {value!r}")

    def above(self, name: str, value: float, minimum: float) -> None:
        """``value > minimum`` (NaN fails)."""
        if not value > minimum:
            self.add(name, f"must be > {minimum}, got {value!r}")

    def within(self, name: str, value: float, low: float, high: float) -> None:
        """``low <= value <= high`` (NaN fails)."""
        if not low <= value <= high:
            self.add(name, f"must be in [{low}, {high}], got {value!r}")

    def finite(self, name: str, value: float) -> None:
        if not math.isfinite(value):
            self.add(name, f"must be a finite number, got {value!r}")

    def one_of(self, name: str, value: Any, allowed: typing.Iterable[Any]) -> bool:
        """``value`` is one of ``allowed`` (listed in the message); returns whether."""
        options = list(allowed)
        if value in options:
            return True
        self.add(name, f"unknown {value!r}; allowed: {', '.join(map(str, options))}")
        return False

    def options(
        self, name: str, fn: Callable[..., Any], given: Mapping[str, Any], *, skip: int = 0
    ) -> None:
        """The option table ``given`` (field ``name``) fits ``fn``'s keyword options."""
        for option, message in check_options(fn, given, skip=skip):
            self.add(f"{name}.{option}", message)


Check = Callable[[Any, Problems], None]
_CHECKS: dict[type, list[Check]] = {}


def register_check(cls: type[C]) -> Callable[[Callable[[C, Problems], None]], Check]:
    """Decorator: run ``fn(section, problems)`` on every config section of class ``cls``
    (or a subclass) that ``validate`` meets."""

    def decorate(fn: Callable[[C, Problems], None]) -> Check:
        _CHECKS.setdefault(cls, []).append(fn)
        return fn

    return decorate


def validate(
    config: Any, *, toml_path: str | Path | None = None, overrides: Sequence[str] = ()
) -> None:
    """Raise :class:`ConfigError` listing every problem of ``config`` (nothing is done,
    nothing is written); return None when it can run.

    ``toml_path`` and ``overrides`` (what ``load_config`` built the config from) only
    serve the message: each problem is located in the file (line) or the override.
    First every field is checked against its type; only a well-typed config gets the
    section checks (they compare and look up values).
    """
    problems: list[tuple[str, str]] = []
    _check_types(config, "", problems)
    if not problems:
        _run_checks(config, "", problems)
    if problems:
        where = {}
        for key, _ in problems:
            origin = config_origin(key, toml_path, overrides)
            if origin is not None:
                where[key] = origin
        raise ConfigError.from_problems(problems, where)


def _sections(section: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """``(prefix, section)`` of ``section`` and every config section nested in it."""
    yield prefix, section
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _sections(value, f"{prefix}{f.name}.")


def _check_types(config: Any, prefix: str, problems: list[tuple[str, str]]) -> None:
    for path, section in _sections(config, prefix):
        hints = typing.get_type_hints(type(section))
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                continue
            why = fits(value, hints[f.name])
            if why is not None:
                problems.append((f"{path}{f.name}", why))


def _run_checks(config: Any, prefix: str, problems: list[tuple[str, str]]) -> None:
    for path, section in _sections(config, prefix):
        for cls in type(section).__mro__:
            for check in _CHECKS.get(cls, []):
                check(section, Problems(path, problems))


# --------------------------------------------------------------------------- sections


@register_check(EnvConfig)
def _env(env: EnvConfig, p: Problems) -> None:
    from turnrl.entrypoints import ENTRYPOINT_FORMAT
    from turnrl.envs import ENVS, get_env_spec

    if not env.name and env.ALLOW_NO_ENV:
        return
    p.at_least("n_train_tasks", env.n_train_tasks, 1)
    p.at_least("n_eval_tasks", env.n_eval_tasks, 1)
    if env.name not in ENVS and ENTRYPOINT_FORMAT.match(env.name.strip()):
        try:  # a user's environment, "module:factory": import it now, before any work
            get_env_spec(env.name)
        except ConfigError as err:
            p.add("name", str(err).removeprefix(f"{p.key('name')}: "))
            return
    if p.one_of("name", env.name, sorted(ENVS)):
        spec = ENVS[env.name]
        p.options("env_kwargs", spec.make_env, env.env_kwargs)
        if not check_options(spec.make_tasks, env.task_kwargs, skip=2):
            try:  # values the generator refuses (a reversed range...), before any work
                spec.make_tasks(1, env.seed, **env.task_kwargs)
            except ValueError as err:
                p.add("task_kwargs", str(err))
        p.options("task_kwargs", spec.make_tasks, env.task_kwargs, skip=2)


@register_check(PolicyConfig)
def _policy(policy: PolicyConfig, p: Problems) -> None:
    from turnrl.policy.pretrained import MODEL_SOURCES

    named = ["tiny", *sorted(MODEL_SOURCES)]
    if policy.model not in named and not Path(policy.model).expanduser().is_dir():
        p.add(
            "model",
            f"{policy.model!r} is neither a named model ({', '.join(named)}) nor a local "
            "model directory (models are never downloaded)",
        )
    p.at_least("hidden", policy.hidden, 1)
    p.at_least("layers", policy.layers, 1)
    p.at_least("heads", policy.heads, 1)
    if policy.model == "tiny" and policy.heads >= 1 and policy.hidden % policy.heads:
        p.add("heads", f"{policy.heads} heads do not divide hidden = {policy.hidden}")
    if policy.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        p.add(
            "backend",
            "'vllm' needs the vllm package, which this Python lacks: `make setup-vllm`, "
            "then run .venv-vllm/bin/turnrl",
        )
    if policy.backend == "vllm-server" and not policy.server_url.startswith(
        ("http://", "https://")
    ):
        p.add("server_url", "'vllm-server' needs the vLLM server's http:// or https:// URL")
    p.above("temperature", policy.temperature, 0)
    p.at_least("max_new_tokens", policy.max_new_tokens, 1)
    p.at_least("lora_rank", policy.lora_rank, 0)
    if policy.lora_rank > 0:
        p.above("lora_alpha", policy.lora_alpha, 0)
        if not policy.lora_targets:
            p.add("lora_targets", "must name at least one layer when lora_rank > 0")
    from turnrl.policy.device import resolve_device

    try:
        resolve_device(policy.device)
    except ValueError as err:
        p.add("device", str(err))


@register_check(WarmStartConfig)
def _warm_start(warm: WarmStartConfig, p: Problems) -> None:
    p.at_least("steps", warm.steps, 0)
    p.above("lr", warm.lr, 0)
    p.at_least("batch_size", warm.batch_size, 1)
    p.within("tool_fraction", warm.tool_fraction, 0.0, 1.0)
    p.within("easy_tool_fraction", warm.easy_tool_fraction, 0.0, 1.0)
    if warm.init_from is not None and not Path(warm.init_from).expanduser().is_dir():
        p.add("init_from", f"{warm.init_from!r} is not a saved policy directory")


@register_check(RolloutConfig)
def _rollout(rollout: RolloutConfig, p: Problems) -> None:
    from turnrl.rollout import get_strategy
    from turnrl.rollout.strategies import list_strategies

    p.at_least("group_size", rollout.group_size, 1)
    p.at_least("tasks_per_step", rollout.tasks_per_step, 1)
    p.at_least("workers", rollout.workers, 0)
    if p.one_of("strategy", rollout.strategy, list_strategies()):
        p.options("params", get_strategy(rollout.strategy), rollout.params, skip=3)
        if rollout.workers > 0 and rollout.strategy != "independent":
            p.add("workers", "rollout workers run only the 'independent' strategy")
        if rollout.per_episode_seeds and rollout.strategy != "independent":
            p.add("per_episode_seeds", "only the 'independent' strategy samples per episode")


@register_check(CreditConfig)
def _credit(credit: CreditConfig, p: Problems) -> None:
    from turnrl.credit import get_estimator, list_estimators

    if p.one_of("estimator", credit.estimator, list_estimators(with_aliases=True)):
        p.options("params", get_estimator(credit.estimator).fn, credit.params, skip=1)


@register_check(PPOConfig)
def _ppo(ppo: PPOConfig, p: Problems) -> None:
    p.at_least("tis_cap", ppo.tis_cap, 0.0)
    p.above("lr", ppo.lr, 0)
    p.at_least("minibatch_size", ppo.minibatch_size, 1)
    p.at_least("epochs", ppo.epochs, 1)
    p.at_least("clip_low", ppo.clip_low, 0)
    p.at_least("clip_high", ppo.clip_high, 0)
    p.at_least("kl_coef", ppo.kl_coef, 0)
    p.finite("kl_coef", ppo.kl_coef)
    p.at_least("max_grad_norm", ppo.max_grad_norm, 0)
    p.at_least("max_tokens_per_batch", ppo.max_tokens_per_batch, 1)


@register_check(TrainConfig)
def _train(train: TrainConfig, p: Problems) -> None:
    p.at_least("steps", train.steps, 0)
    p.at_least("eval_every", train.eval_every, 0)
    p.at_least("eval_temperature", train.eval_temperature, 0)
    p.at_least("eval_samples", train.eval_samples, 1)
    p.at_least("log_rollouts_every", train.log_rollouts_every, 0)
    p.at_least("checkpoint_every", train.checkpoint_every, 0)
    p.at_least("keep_checkpoints", train.keep_checkpoints, 1)
    p.at_least("threads", train.threads, 0)


@register_check(RunConfig)
def _run(config: RunConfig, p: Problems) -> None:
    if config.policy.backend != "hf" and config.rollout.workers:
        p.add(
            "policy.backend",
            f"{config.policy.backend!r} samples in this process (the built-in environments' "
            "rollouts and the agent loop's gateway); rollout.workers sample with 'hf' only",
        )
    pool = config.env.n_train_tasks
    if not config.agent.enabled and config.rollout.tasks_per_step > pool >= 1:
        p.add(
            "rollout.tasks_per_step",
            f"{config.rollout.tasks_per_step} distinct tasks per step, but the task pool "
            f"(env.n_train_tasks) holds {pool}",
        )
    if not config.run_dir:
        p.add("run_dir", "must name a directory")
    if config.agent.enabled and config.warm_start.mix == "per_draw":
        _check_agent_mix(config, p)
    elif not config.agent.enabled:
        _check_mix(config.warm_start, config.env.name, p)
        _check_capabilities(config, p)


def _check_capabilities(config: RunConfig, p: Problems) -> None:
    """The optional environment capabilities the run's strategy and estimator need
    (:mod:`turnrl.types`), checked on the environment's class when it is one (a
    factory function is checked when the run first needs the capability)."""
    from turnrl.credit import get_estimator, list_estimators
    from turnrl.envs import ENVS
    from turnrl.types import CAPABILITIES, References, Snapshots

    spec = ENVS.get(config.env.name)
    if spec is None or not isinstance(spec.make_env, type):
        return
    needed = []
    if config.rollout.strategy != "independent":
        needed.append(("rollout.strategy", Snapshots, f"{config.rollout.strategy!r}"))
    known = config.credit.estimator in list_estimators(with_aliases=True)
    if known and "info_gain" in get_estimator(config.credit.estimator).needs:
        needed.append(("credit.estimator", References, f"{config.credit.estimator!r}"))
    for key, capability, what in needed:
        if not issubclass(spec.make_env, capability):
            p.add(
                key,
                f"{what} needs an environment with {CAPABILITIES[capability]}; "
                f"{config.env.name!r} ({spec.make_env.__name__}) has none",
            )


def _check_agent_mix(config: RunConfig, p: Problems) -> None:
    """An agent's ``mix = "per_draw"`` runs its teacher once per variant of
    ``tasks.train``'s built-in environment (:mod:`turnrl.train.agent.teacher_mix`); without a
    teacher (``warm_start.init_from``, or no warm start) there is nothing to mix."""
    from turnrl.envs import ENVS

    if config.warm_start.teacher is None:
        return
    spec = ENVS.get(config.tasks.train)
    if spec is None or spec.demo_variants is None:
        p.add(
            "warm_start.mix",
            f"'per_draw' for an agent needs tasks.train to be a built-in environment with "
            f"demo_variants; {config.tasks.train!r} is not (use 'per_task': the teacher "
            "sets its mix)",
        )


def _check_mix(warm: WarmStartConfig, env_name: str, p: Problems) -> None:
    """``mix = "per_draw"`` needs an environment that lists its demonstration variants."""
    from turnrl.envs import ENVS

    spec = ENVS.get(env_name)
    if warm.mix != "per_draw" or spec is None:
        return
    if spec.demo_options is not None and spec.demo_variants is None:
        p.add(
            "warm_start.mix",
            f"'per_draw' needs the environment's demo_variants; {env_name!r} has none "
            "(use 'per_task')",
        )


# --------------------------------------------------------------------------- agent loop


@register_check(AgentConfig)
def _agent(agent: AgentConfig, p: Problems) -> None:
    from turnrl.entrypoints import ENTRYPOINT_FORMAT

    if agent.entrypoint is not None and agent.command:
        p.add("command", "set exactly one of agent.entrypoint and agent.command, not both")
    if agent.entrypoint is not None and not ENTRYPOINT_FORMAT.match(agent.entrypoint):
        p.add(
            "entrypoint",
            f"expected 'package.module:function' or 'path/to/file.py:function', "
            f"got {agent.entrypoint!r}",
        )
    if not agent.model:
        p.add("model", "must name a model (it becomes the turns' role)")
    p.at_least("concurrency", agent.concurrency, 1)
    p.above("timeout_s", agent.timeout_s, 0)
    p.within("max_failure_fraction", agent.max_failure_fraction, 0.0, 1.0)
    p.within("port", agent.port, 0, 65535)
    p.at_least("max_batch", agent.max_batch, 1)
    p.at_least("batch_window_ms", agent.batch_window_ms, 0)


@register_check(TasksConfig)
def _tasks(tasks: TasksConfig, p: Problems) -> None:
    p.at_least("n_train", tasks.n_train, 1)
    p.at_least("n_eval", tasks.n_eval, 1)


@register_check(RunConfig)
def _agent_run(config: RunConfig, p: Problems) -> None:
    """What an ``[agent]`` run needs of the other sections (and what only it may use)."""
    from turnrl.credit import get_estimator
    from turnrl.train.agent.tasks import check_task_spec, is_task_file

    if not config.agent.enabled:
        if config.warm_start.teacher is not None:
            p.add("warm_start.teacher", "is for agent programs: set agent.entrypoint or command")
        return
    for name in ("train", "eval"):
        spec = getattr(config.tasks, name)
        if spec is not None:
            try:
                check_task_spec(spec, f"tasks.{name}")
            except ValueError as err:
                p.add(f"tasks.{name}", str(err).split(": ", 1)[1])
    if is_task_file(config.tasks.train) and config.tasks.eval is None:
        p.add("tasks.eval", "needed when tasks.train is a file: the held-out tasks to evaluate on")
    if (
        not is_task_file(config.tasks.train)
        and config.rollout.tasks_per_step > config.tasks.n_train
    ):
        p.add(
            "rollout.tasks_per_step",
            f"{config.rollout.tasks_per_step} distinct tasks per step, but tasks.n_train "
            f"is {config.tasks.n_train}",
        )
    if config.rollout.strategy != "independent":
        p.add("rollout.strategy", "agent programs run independent rollouts only")
    if config.rollout.workers > 0:
        p.add("rollout.workers", "agent programs run in this process (use agent.concurrency)")
    needs = get_estimator(config.credit.estimator).needs
    if "info_gain" in needs:
        p.add(
            "credit.estimator",
            f"{config.credit.estimator!r} needs information gain, which needs a reference "
            "answer that agent tasks do not have",
        )
    teacher = config.warm_start.teacher
    if teacher is not None and config.warm_start.init_from is not None:
        p.add("warm_start.teacher", "set either warm_start.teacher or warm_start.init_from")
    if teacher is not None:
        from turnrl.entrypoints import ENTRYPOINT_FORMAT

        if not ENTRYPOINT_FORMAT.match(teacher):
            p.add("warm_start.teacher", f"expected 'module:function', got {teacher!r}")
    p.at_least("warm_start.teacher_tasks", config.warm_start.teacher_tasks, 0)


# --------------------------------------------------------------------------- iterate


@register_check(IterateWarmStartConfig)
def _iterate_warm_start(warm: IterateWarmStartConfig, p: Problems) -> None:
    from turnrl.envs.negotiation import STYLES

    if warm.style is not None:
        p.one_of("style", warm.style, STYLES)
    for instruction, style in warm.persona_styles.items():
        if style not in STYLES:
            p.add(
                f"persona_styles[{instruction!r}]",
                f"unknown style {style!r}; allowed: {', '.join(STYLES)}",
            )


@register_check(DeployConfig)
def _deploy(deploy: DeployConfig, p: Problems) -> None:
    p.at_least("tasks_per_iteration", deploy.tasks_per_iteration, 1)
    p.at_least("conversations_per_task", deploy.conversations_per_task, 1)
    if not deploy.temperatures:
        p.add("temperatures", "must list at least one temperature")
    for i, temperature in enumerate(deploy.temperatures):
        p.at_least(f"temperatures[{i}]", temperature, 0)
    if not deploy.personas:
        p.add("personas", 'must list at least one entry ("" = no persona)')


@register_check(QConfig)
def _q(q: QConfig, p: Problems) -> None:
    p.within("gamma", q.gamma, 0.0, 1.0)
    p.at_least("hidden", q.hidden, 1)
    p.at_least("layers", q.layers, 1)
    p.at_least("steps", q.steps, 0)
    p.above("lr", q.lr, 0)
    p.at_least("batch_size", q.batch_size, 1)
    if not 0 <= q.holdout_fraction < 1:
        p.add("holdout_fraction", f"must be in [0, 1), got {q.holdout_fraction!r}")
    p.at_least("calibration_bins", q.calibration_bins, 1)


@register_check(ImproveConfig)
def _improve(improve: ImproveConfig, p: Problems) -> None:
    p.at_least("steps", improve.steps, 1)
    p.at_least("states_per_step", improve.states_per_step, 1)
    p.at_least("candidates", improve.candidates, 1)
    p.above("temperature", improve.temperature, 0)
    p.at_least("std_floor", improve.std_floor, 0)
    if improve.malformed_score is not None:
        p.finite("malformed_score", improve.malformed_score)


@register_check(IterateEvalConfig)
def _iterate_eval(evaluation: IterateEvalConfig, p: Problems) -> None:
    p.at_least("temperature", evaluation.temperature, 0)
    p.at_least("samples", evaluation.samples, 1)


@register_check(IterateConfig)
def _iterate(config: IterateConfig, p: Problems) -> None:
    from turnrl.envs.negotiation import SETTINGS

    if config.policy.backend != "hf":
        p.add("policy.backend", "Iterative GRPO samples with the 'hf' backend only")
    p.at_least("iterations", config.iterations, 0)
    p.at_least("threads", config.threads, 0)
    if config.warm_start.teacher is not None:
        p.add("warm_start.teacher", "is for agent programs (turnrl train with [agent])")
    p.at_least("keep_checkpoints", config.keep_checkpoints, 1)
    if not config.run_dir:
        p.add("run_dir", "must name a directory")
    if not config.env.name:
        return
    _check_mix(config.warm_start, config.env.name, p)
    pool = config.env.n_train_tasks
    if config.deploy.tasks_per_iteration > pool >= 1:
        p.add(
            "deploy.tasks_per_iteration",
            f"{config.deploy.tasks_per_iteration} distinct tasks per iteration, but the task "
            f"pool (env.n_train_tasks) holds {pool}",
        )
    if config.warm_start.persona_styles and config.env.name not in SETTINGS:
        p.add(
            "warm_start.persona_styles",
            f"needs a negotiation setting ({', '.join(sorted(SETTINGS))}), "
            f"not env.name = {config.env.name!r}",
        )
