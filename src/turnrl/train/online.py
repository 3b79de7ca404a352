"""Online multi-turn RL: warm start, then rollouts -> credit -> PPO-clip updates.

One training row per agent turn, with its exact context (``prompt_ids``) and its
sampled tokens; one advantage per row from any ``turnrl.credit`` estimator (by
name); the A2TGPO clip factor when the estimator returns one; optional KL to the
warm-started policy. Aggregation weights are computed once per batch, so the
mini-batch split does not change the objective.

Everything a run produces lives in its run directory::

    config.toml        the resolved config (with every field's docstring)
    warm_start/        the warm-started policy (also the KL reference)
    metrics.jsonl      one line per step (and eval metrics on eval steps)
    rollouts/          turn records of some steps (``log_rollouts_every``)
    checkpoints/       model + optimizer + RNG + sampler state, written atomically

``resume=True`` continues a killed run from its last checkpoint; the random
streams are all derived from (seed, step) or restored from the checkpoint, so the
resumed run produces the same numbers as an uninterrupted one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from turnrl.credit import compute_credit
from turnrl.envs import make_env, make_tasks
from turnrl.io import append_jsonl, atomic_write_json, atomic_write_text, truncate_jsonl_steps
from turnrl.policy import HFPolicy, build_tiny_policy
from turnrl.policy.lora import is_adapter_model, lora_policy
from turnrl.policy.pretrained import resolve_model_path
from turnrl.records import dumps_record
from turnrl.rollout import RolloutBatch, StrategyContext, get_strategy, run_episodes
from turnrl.rollout.strategies import RolloutPool
from turnrl.rollout.tree import physical_env_steps
from turnrl.table import TurnTable
from turnrl.train.checkpoint import load_latest_checkpoint, restore_rng_state, save_checkpoint
from turnrl.train.config import PolicyConfig, RunConfig, TrainConfig, config_to_toml_text
from turnrl.train.info_gain import add_information_gain
from turnrl.train.loss import aggregation_weights, ppo_clip_loss
from turnrl.train.metrics import advantage_metrics, episode_metrics
from turnrl.train.sft import demonstration_examples, supervised_warm_start
from turnrl.types import Task

INFO_GAIN_ESTIMATORS = frozenset({"a2tgpo", "igpo"})
"""Estimators that need ``info_gain``: the trainer computes it before credit."""

TIMING_KEYS = (
    "seconds_sampling",
    "seconds_env",
    "seconds_credit",
    "seconds_update",
    "seconds_step",
)
"""Metrics that depend on the machine's speed (excluded from resume-equality checks)."""


def build_policy(config: PolicyConfig, seed: int) -> HFPolicy:
    """The policy named by ``config.model`` (``"tiny"``, a named pretrained model such as
    ``"smollm2"``, or a local model directory), with LoRA adapters when ``lora_rank > 0``."""
    if config.model == "tiny":
        policy = build_tiny_policy(seed, hidden=config.hidden, layers=config.layers)
    else:
        policy = HFPolicy.from_pretrained(resolve_model_path(config.model))
    return with_lora(policy, config)


def with_lora(policy: HFPolicy, config: PolicyConfig) -> HFPolicy:
    """``policy`` with fresh LoRA adapters if ``config.lora_rank > 0`` and it has none yet."""
    if config.lora_rank <= 0 or is_adapter_model(policy.model):
        return policy
    return lora_policy(
        policy, rank=config.lora_rank, alpha=config.lora_alpha, targets=config.lora_targets
    )


def pad_rows(rows: list[list[float]], width: int, value: float = 0.0) -> torch.Tensor:
    """Right-pad float rows into a ``(len(rows), width)`` tensor."""
    out = torch.full((len(rows), width), value, dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


@dataclass
class UpdateBatch:
    """The trainable rows of one step (turns with at least one response token)."""

    contexts: list[list[int]]
    responses: list[list[int]]
    old_logp_B_T: torch.Tensor
    mask_B_T: torch.Tensor
    adv_B: torch.Tensor
    clip_factor_B: torch.Tensor | None
    weight_B_T: torch.Tensor


def build_update_batch(
    records: list[dict[str, Any]],
    table: TurnTable,
    advantages: np.ndarray,
    clip_factor: np.ndarray | None,
    aggregation: str,
) -> UpdateBatch:
    """The padded update batch of the rows that are trained on.

    Rows without response tokens, and rows marked ``train = false`` (tree
    rollouts' copies of shared turns: they count in the credit table, for returns
    and trajectory structure, but are updated on once, through the original), are
    left out; ``advantages`` and ``clip_factor`` are per record, as ``table``.
    """
    keep = [i for i, r in enumerate(records) if r["response_ids"] and r.get("train", True)]
    if not keep:
        raise ValueError("no record to update on (every row is train=false or has no response)")
    responses = [records[i]["response_ids"] for i in keep]
    width = max(len(r) for r in responses)
    mask = pad_rows([[1.0] * len(r) for r in responses], width)
    rollout = torch.as_tensor(table.traj_code[keep])
    return UpdateBatch(
        contexts=[records[i]["prompt_ids"] for i in keep],
        responses=responses,
        old_logp_B_T=pad_rows([records[i]["logprobs"] for i in keep], width),
        mask_B_T=mask,
        adv_B=torch.as_tensor(advantages[keep], dtype=torch.float32),
        clip_factor_B=None
        if clip_factor is None
        else torch.as_tensor(clip_factor[keep], dtype=torch.float32),
        weight_B_T=aggregation_weights(mask, aggregation, rollout),
    )


@dataclass(frozen=True)
class PPOSettings:
    """The PPO-clip update's knobs (see ``TrainConfig`` for their meaning)."""

    epochs: int
    minibatch_size: int
    clip_low: float
    clip_high: float
    kl_coef: float
    kl_estimator: str
    max_grad_norm: float

    @classmethod
    def from_config(cls, cfg: TrainConfig | Any) -> PPOSettings:
        """From any config section with these fields (``TrainConfig``, ``ImproveConfig``)."""
        return cls(
            epochs=cfg.epochs,
            minibatch_size=cfg.minibatch_size,
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            kl_coef=cfg.kl_coef,
            kl_estimator=cfg.kl_estimator,
            max_grad_norm=cfg.max_grad_norm,
        )


def ppo_update(
    policy: HFPolicy,
    optimizer: torch.optim.Optimizer,
    batch: UpdateBatch,
    settings: PPOSettings,
    *,
    temperature: float,
    reference: HFPolicy | None,
    seed: int,
) -> dict[str, float]:
    """Several epochs of mini-batch PPO-clip steps on one batch of turns.

    Shared by the online trainer and Iterative GRPO's improvement step. ``seed``
    fixes the mini-batch order; ``reference`` (frozen) enables the KL penalty.
    Returns the mean of each loss statistic over the optimiser steps.
    """
    n = len(batch.contexts)
    size = min(settings.minibatch_size, n)
    n_minibatches = -(-n // size)
    generator = torch.Generator().manual_seed(seed)
    stats: list[dict[str, float]] = []
    policy.model.train()
    for _ in range(settings.epochs):
        order = torch.randperm(n, generator=generator).tolist()
        for start in range(0, n, size):
            rows = order[start : start + size]
            contexts = [batch.contexts[i] for i in rows]
            responses = [batch.responses[i] for i in rows]
            logp_B_T, mask_B_T = policy.response_logprobs(
                contexts, responses, temperature=temperature
            )
            width = logp_B_T.shape[1]
            ref = None
            if reference is not None:
                with torch.no_grad():
                    ref, _ = reference.response_logprobs(
                        contexts, responses, temperature=temperature
                    )
            loss, info = ppo_clip_loss(
                logp_B_T,
                batch.old_logp_B_T[rows, :width],
                batch.adv_B[rows],
                mask_B_T,
                batch.weight_B_T[rows, :width] * n_minibatches,
                clip_low=settings.clip_low,
                clip_high=settings.clip_high,
                clip_factor_B=None if batch.clip_factor_B is None else batch.clip_factor_B[rows],
                ref_logp_B_T=ref,
                kl_coef=settings.kl_coef,
                kl_estimator=settings.kl_estimator,
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), settings.max_grad_norm)
            optimizer.step()
            stats.append({**info, "loss": float(loss.item()), "grad_norm": float(norm)})
    policy.model.eval()
    return {k: float(np.mean([s[k] for s in stats])) for k in stats[0]}


class OnlineTrainer:
    """Runs one training job described by a ``RunConfig``."""

    def __init__(
        self,
        config: RunConfig,
        *,
        resume: bool = False,
        quiet: bool = False,
        pool: RolloutPool | None = None,
    ) -> None:
        self.config = config
        self.run_dir = Path(config.run_dir)
        self.resume = resume
        self.quiet = quiet
        env = config.env
        self.train_tasks = make_tasks(env.name, env.n_train_tasks, env.seed, **env.task_kwargs)
        self.tasks_by_id = {t.task_id: t for t in self.train_tasks}
        self._reference_env = make_env(env.name, **env.env_kwargs)
        # Evaluation tasks come from another seed. Small pools (the calculator's easy
        # problems) overlap with training; ``eval_unseen`` in the metrics says how much.
        self.eval_tasks = make_tasks(env.name, env.n_eval_tasks, env.seed + 7919, **env.task_kwargs)
        train_ids = {t.task_id for t in self.train_tasks}
        self.eval_unseen = float(np.mean([t.task_id not in train_ids for t in self.eval_tasks]))
        if config.train.threads > 0:
            torch.set_num_threads(config.train.threads)
        torch.manual_seed(config.train.seed)
        self.policy = build_policy(config.policy, config.train.seed)
        self.reference: HFPolicy | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.sampler = np.random.default_rng(config.train.seed)
        self.step = 0
        self.env_steps = 0
        """Cumulative agent turns taken in training environments."""
        self.tokens = 0
        """Cumulative tokens sampled in training."""
        independent = config.rollout.strategy == "independent"
        if config.rollout.workers > 0 and (pool is None or not independent):
            raise ValueError(
                "rollout.workers > 0 needs the independent strategy and a rollout pool: "
                "run it with turnrl.integrations.ray_workers.train_with_workers"
            )
        self.pool = pool
        """Runs the independent strategy's episodes elsewhere (``rollout.workers``); it gets
        the weights before the first step and after every update."""
        self.policy_version = 0
        """Updates applied so far: the version of the weights pushed to ``pool``."""

    # ------------------------------------------------------------------ set-up
    def _make_env(self):
        return make_env(self.config.env.name, **self.config.env.env_kwargs)

    def _reference_response(self, task_id: str) -> str | None:
        task = self.tasks_by_id.get(task_id)
        return None if task is None else self._reference_env.reference_response(task)

    def _warm_start(self) -> None:
        cfg = self.config.warm_start
        out = self.run_dir / "warm_start"
        if cfg.init_from is not None:
            self.policy = with_lora(HFPolicy.from_pretrained(cfg.init_from), self.config.policy)
        elif cfg.steps > 0:
            examples = demonstration_examples(
                self.policy,
                self.config.env.name,
                self.train_tasks,
                seed=self.config.train.seed,
                tool_fraction=cfg.tool_fraction,
                easy_tool_fraction=cfg.easy_tool_fraction,
                env_kwargs=self.config.env.env_kwargs,
            )
            with _progress(self.quiet) as bar:
                task = bar.add_task("warm start", total=cfg.steps)
                losses = supervised_warm_start(
                    self.policy,
                    examples,
                    steps=cfg.steps,
                    lr=cfg.lr,
                    batch_size=cfg.batch_size,
                    seed=self.config.train.seed,
                    progress=(bar, task),
                )
            atomic_write_json(self.run_dir / "warm_start_losses.json", losses)
        self.policy.save(out)

    def _setup(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.run_dir / "config.toml", config_to_toml_text(self.config))
        checkpoint = load_latest_checkpoint(self.run_dir) if self.resume else None
        if checkpoint is None:
            if (self.run_dir / "metrics.jsonl").exists():
                (self.run_dir / "metrics.jsonl").unlink()
            self._warm_start()
        else:
            self.policy = HFPolicy.from_pretrained(self.run_dir / "warm_start")
        tcfg = self.config.train
        if tcfg.kl_coef > 0:
            self.reference = HFPolicy.from_pretrained(self.run_dir / "warm_start").clone_frozen()
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=tcfg.lr, weight_decay=0.0)
        if checkpoint is not None:
            self.policy.load_state_dict(checkpoint["model"])
            self.optimizer.load_state_dict(checkpoint["optimizer"])
            self.sampler.bit_generator.state = checkpoint["extra"]["sampler"]
            self.step = int(checkpoint["step"])
            self.env_steps = int(checkpoint["extra"]["env_steps"])
            self.tokens = int(checkpoint["extra"]["tokens"])
            self.policy_version = int(checkpoint["extra"].get("policy_version", self.step))
            truncate_jsonl_steps(self.run_dir / "metrics.jsonl", self.step)
            restore_rng_state(checkpoint["rng"])  # after building models, which draw from it
        if self.pool is not None:
            self.pool.push_weights(self.policy.state_dict(), self.policy_version)

    def _checkpoint(self) -> None:
        assert self.optimizer is not None
        save_checkpoint(
            self.run_dir,
            self.step,
            self.policy.state_dict(),
            self.optimizer.state_dict(),
            {
                "sampler": self.sampler.bit_generator.state,
                "env_steps": self.env_steps,
                "tokens": self.tokens,
                "policy_version": self.policy_version,
            },
            keep_last=self.config.train.keep_checkpoints,
        )

    # --------------------------------------------------------------- one step
    def rollouts(
        self, tasks: list[Task], group_size: int, temperature: float, seed: int, prefix: str
    ) -> RolloutBatch:
        self.policy.model.eval()
        return run_episodes(
            self.policy,
            self._make_env,
            tasks,
            group_size=group_size,
            max_new_tokens=self.config.policy.max_new_tokens,
            temperature=temperature,
            seed=seed,
            traj_prefix=prefix,
        )

    def evaluate(self) -> dict[str, float]:
        """Success and tool use on the held-out tasks (greedy by default)."""
        cfg = self.config.train
        batch = self.rollouts(
            self.eval_tasks, cfg.eval_samples, cfg.eval_temperature, seed=0, prefix="eval-"
        )
        return {**episode_metrics(batch.episodes, prefix="eval_"), "eval_unseen": self.eval_unseen}

    def update(self, batch: UpdateBatch) -> dict[str, float]:
        """Several epochs of mini-batch PPO-clip steps on one batch of turns."""
        cfg = self.config.train
        assert self.optimizer is not None
        return ppo_update(
            self.policy,
            self.optimizer,
            batch,
            PPOSettings.from_config(cfg),
            temperature=self.config.policy.temperature,
            reference=self.reference,
            seed=cfg.seed * 100_003 + self.step,
        )

    def learn(self, records: list[dict[str, Any]]) -> dict[str, float]:
        """Credit on ``records`` (one row per turn), then a PPO-clip update on them."""
        cfg = self.config
        t0 = time.perf_counter()
        if cfg.credit.estimator in INFO_GAIN_ESTIMATORS:
            self.policy.model.eval()
            add_information_gain(self.policy, records, self._reference_response)
        table = TurnTable.from_records(records, source=f"step {self.step}")
        credit = compute_credit(table, cfg.credit.estimator, **cfg.credit.params)
        seconds_credit = time.perf_counter() - t0
        for record, advantage in zip(records, credit.advantages, strict=True):
            record["advantage"] = float(advantage)
        t0 = time.perf_counter()
        update = build_update_batch(
            records, table, credit.advantages, credit.clip_factor, cfg.train.aggregation
        )
        losses = self.update(update)
        self.policy_version += 1
        if self.pool is not None:
            self.pool.push_weights(self.policy.state_dict(), self.policy_version)
        return {
            **advantage_metrics(table, credit.advantages, cfg.credit.estimator),
            **losses,
            "seconds_credit": seconds_credit,
            "seconds_update": time.perf_counter() - t0,
        }

    def train_step(self) -> dict[str, Any]:
        """Draw tasks, let the rollout strategy collect and learn, return the step's metrics."""
        cfg = self.config
        started = time.perf_counter()
        self.step += 1
        picks = self.sampler.choice(
            len(self.train_tasks), cfg.rollout.tasks_per_step, replace=False
        )
        self.policy.model.eval()
        context = StrategyContext(
            policy=self.policy,
            make_env=self._make_env,
            max_new_tokens=cfg.policy.max_new_tokens,
            temperature=cfg.policy.temperature,
            learn=self.learn,
            seed=cfg.train.seed * 1_000_003 + self.step,
            traj_prefix=f"s{self.step}-",
            runner=run_episodes if self.pool is None else self.pool.run_episodes,
        )
        strategy = get_strategy(cfg.rollout.strategy)
        experience = strategy(
            context,
            [self.train_tasks[i] for i in picks],
            cfg.rollout.group_size,
            **cfg.rollout.params,
        )
        batch = experience.batch
        if _due(self.step, cfg.train.log_rollouts_every):
            path = self.run_dir / "rollouts" / f"step-{self.step:06d}.jsonl"
            path.parent.mkdir(exist_ok=True)
            atomic_write_text(path, "".join(dumps_record(r) + "\n" for r in batch.records))
        self.env_steps += physical_env_steps(batch.records)
        self.tokens += batch.sampled_tokens
        learned = _mean_stats(experience.learn_stats)
        return {
            "step": self.step,
            "episodes": len(batch.episodes),
            "env_steps": self.env_steps,
            "tokens": self.tokens,
            **episode_metrics(batch.episodes),
            **learned,
            **experience.extra,
            "seconds_sampling": batch.seconds_sampling,
            "seconds_env": batch.seconds_env,
            "seconds_step": time.perf_counter() - started,
        }

    # -------------------------------------------------------------------- run
    def run(self, *, stop_after: int | None = None) -> Path:
        """Train to ``train.steps``; ``stop_after`` ends early (used to test resume)."""
        self._setup()
        cfg = self.config.train
        metrics_path = self.run_dir / "metrics.jsonl"
        if self.step == 0:
            append_jsonl(metrics_path, {"step": 0, **self.evaluate()})
        with _progress(self.quiet) as bar:
            task = bar.add_task("RL", total=cfg.steps, completed=self.step)
            while self.step < cfg.steps:
                if stop_after is not None and self.step >= stop_after:
                    return self.run_dir
                row = self.train_step()
                if _due(self.step, cfg.eval_every) or self.step == cfg.steps:
                    row.update(self.evaluate())
                append_jsonl(metrics_path, row)
                if _due(self.step, cfg.checkpoint_every) or self.step == cfg.steps:
                    self._checkpoint()
                bar.update(
                    task,
                    advance=1,
                    description=_describe(row),
                )
        return self.run_dir


def _due(step: int, every: int) -> bool:
    """Whether a periodic action (``every`` steps; 0 = never) falls on ``step``."""
    return every > 0 and step % every == 0


def _mean_stats(stats: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each statistic over several learn calls; seconds are summed."""
    keys = sorted({k for s in stats for k in s})
    out = {}
    for key in keys:
        values = [s[key] for s in stats if key in s]
        out[key] = float(np.sum(values) if key.startswith("seconds_") else np.mean(values))
    return out


def _describe(row: dict[str, Any]) -> str:
    parts = [f"RL step {row['step']}", f"success {row.get('success', 0):.2f}"]
    if "tool_rate_hard" in row:
        parts.append(f"tool(hard) {row['tool_rate_hard']:.2f}")
    parts.append(f"turns {row.get('turns', 0):.2f}")
    return "  ".join(parts)


def _progress(quiet: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=quiet,
        transient=False,
    )
