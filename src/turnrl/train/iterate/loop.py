"""Iterative GRPO: batch-online policy iteration with a learned turn-level Q.

Jiang et al. 2025 (arXiv 2511.21638). Conversational agents are deployed,
logged, retrained in batches and redeployed; the customer cannot sit in the
training loop. Each iteration:

1. **Deploy** the current policy ``pi_i`` on a batch of tasks (optionally at several
   sampling temperatures, for exploration) and log every turn as a turn record.
   With ``--from-logs`` the first batch is imported production logs instead.
2. **Evaluate**: Monte Carlo return ``G_t`` of every logged ``(state, response)``
   (``turnrl.credit.returns.return_to_go``), and a fit of ``Q^{pi_i}`` to them
   (:mod:`turnrl.train.iterate.qmodel`) with a held-out split of conversations and
   calibration metrics.
3. **Improve**: for logged states, sample ``G`` candidates with the current
   policy, score them with Q, normalise within the state (the ``q`` estimator:
   candidates of one state share a ``node_id``) and take PPO-clip steps with a
   KL penalty to ``pi_i``. No environment or counterpart is called here: the
   improvement function receives no environment factory, and it runs inside
   :func:`~turnrl.train.iterate.improve.forbid_env_calls`, which makes every ``Env``
   method raise.
4. Redeploy ``pi_{i+1}`` and repeat.

Departures and choices: the paper leaves the state distribution of the
improvement step as "visited states"; here states are logged turns drawn
uniformly (so a state visited twice weighs twice, as under the deployed
policy's state distribution), ``states_per_step`` per GRPO step. Q is refitted
from scratch each iteration by default (``q.refit``). The logged behaviour
log-probs are not used: improvement is on-policy single-turn GRPO against Q.

Run directory::

    config.toml          resolved config (documented)
    warm_start/          the policy deployed first (pi_0)
    metrics.jsonl        step 0: held-out eval of pi_0; step i: iteration i
    iter-NNN/deploy.jsonl   the logged turns (with ``mc_return``)
    iter-NNN/q/          the fitted Q;  iter-NNN/q_quality.json  reliability tables
    iter-NNN/policy/     the improved policy (``save_policies``)
    checkpoints/         policy, optimiser, task sampler and RNG state after each
                         finished iteration (:mod:`turnrl.train.checkpoint`)
    policy/              the last improved policy, as a Hugging Face model directory
                         (``turnrl export``'s format, docs/export.md)

The order of a run is :class:`~turnrl.train.lifecycle.Lifecycle`'s (an iteration is
a step; every one evaluates and checkpoints). A killed run continues with
``resume=True`` (``turnrl iterate --resume``) from the last finished iteration:
metrics rows of unfinished iterations are dropped and the iteration is redone. Every
random stream is derived from (seed, iteration) or restored from the checkpoint, so
the resumed run produces the numbers an uninterrupted one would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from turnrl.envs import make_env
from turnrl.errors import ConfigError
from turnrl.io import atomic_write_json, atomic_write_text, replace_directory
from turnrl.records import dumps_record
from turnrl.rollout import run_episodes
from turnrl.train.iterate.chatlogs import read_chat_logs, tokenise_conversations
from turnrl.train.iterate.config import IterateConfig
from turnrl.train.iterate.deploy import deploy
from turnrl.train.iterate.improve import (
    FormatCheck,
    LoggedState,
    improve_policy,
    logged_states,
    trainable,
)
from turnrl.train.iterate.qmodel import (
    QFit,
    QFunction,
    QModel,
    build_q_model,
    fit_q,
    mc_returns,
    q_examples,
)
from turnrl.train.iterate.qquality import q_quality
from turnrl.train.iterate.warm_start import warm_start_examples
from turnrl.train.lifecycle import LifecycleRun, Schedule, seed_process
from turnrl.train.metrics import episode_metrics
from turnrl.train.run import (
    Checkpoint,
    RunDirectory,
    build_policy,
    derive_seed,
    initial_policy,
    task_split,
)
from turnrl.train.update.ppo import ppo_update
from turnrl.train.validate import validate
from turnrl.types import Env, ResponseChecks, Task, TurnRecord


class IterativeGRPO(LifecycleRun):
    """Runs one ``turnrl iterate`` job described by an ``IterateConfig``.

    ``from_logs``: a chat-log JSONL file (:mod:`turnrl.train.iterate.chatlogs`) used as the
    first iteration's deployed batch. ``resume``: continue from the run directory's
    last checkpoint (a fresh start when it has none).
    """

    SPLITS_OVER_RANKS = False
    """Whether this trainer is rank 0 of several (:mod:`turnrl.train.iterate.distributed`)."""

    def __init__(
        self,
        config: IterateConfig,
        *,
        from_logs: str | Path | None = None,
        quiet: bool = False,
        resume: bool = False,
        overwrite: bool = False,
    ) -> None:
        validate(config)
        self.config = config
        self.quiet = quiet
        self.from_logs = Path(from_logs) if from_logs is not None else None
        env = config.env
        self.has_env = bool(env.name)
        if not self.has_env and self.from_logs is None:
            raise ConfigError("env.name is empty: give --from-logs, or name an environment")
        # Validate the logs and the run directory before anything is written or trained.
        self.conversations = read_chat_logs(self.from_logs) if self.from_logs else None
        self.run_directory = RunDirectory.open(
            config,
            resume=resume,
            overwrite=overwrite,
            keep_checkpoints=config.keep_checkpoints,
            quiet=quiet,
            split_over_ranks=self.SPLITS_OVER_RANKS,
        )
        self.run_dir = self.run_directory.path
        self.train_tasks: list[Task] = []
        self.eval_tasks: list[Task] = []
        if self.has_env:
            tasks = task_split(env)
            self.train_tasks, self.eval_tasks = tasks.train, tasks.eval
        seed_process(config.seed, config.threads)
        self.policy = build_policy(config.policy, config.seed)
        self.logged: list[TurnRecord] | None = None
        """The imported conversations as turn records (``--from-logs``)."""
        if self.conversations is not None:
            # Tokenised now, with the policy the run starts from (its chat template; the
            # weights do not matter), so a conversation the model cannot take is refused
            # before anything is written.
            self.policy = initial_policy(self.policy, config.warm_start, config.policy)
            self.logged = tokenise_conversations(
                self.policy,
                self.conversations,
                source=str(self.from_logs),
                max_new_tokens=config.policy.max_new_tokens,
            )
        self.sampler = np.random.default_rng(config.seed)
        self.optimizer: torch.optim.Optimizer | None = None
        self.q_model: QModel | None = None
        self.previous_q: QFunction | None = None
        self.conversations_deployed = 0
        self.iteration = 0
        self._imported: tuple[list[TurnRecord], dict[str, float]] | None = None
        """The imported logs as iteration 1's batch and its metrics (a fresh run)."""

    # ------------------------------------------------------------------ set-up
    def _make_env(self) -> Env:
        return make_env(self.config.env.name, **self.config.env.env_kwargs)

    def _warm_start(self, log_records: list[TurnRecord] | None) -> None:
        """SFT on demonstrations (or on the logs when there is no env), unless
        ``init_from`` already gave the policy; saves ``warm_start/``."""
        self.policy = self.run_directory.warm_start(
            self.policy,
            self.config.warm_start,
            lambda: warm_start_examples(
                self.policy, self.config, self.train_tasks if self.has_env else None, log_records
            ),
            seed=self.config.seed,
            update=self.config.improve,
        )

    # --------------------------------------------------------------- the steps
    def evaluate_policy(self) -> dict[str, float]:
        """Deal rate / value (success / return) on the held-out tasks; {} without an env."""
        if not self.has_env:
            return {}
        cfg = self.config.eval
        self.policy.model.eval()
        batch = run_episodes(
            self.policy,
            self._make_env,
            self.eval_tasks,
            group_size=cfg.samples,
            max_new_tokens=self.config.policy.max_new_tokens,
            temperature=cfg.temperature,
            seed=0,
            traj_prefix="eval-",
        )
        return episode_metrics(batch.episodes, prefix="eval_")

    def collect(self, iteration: int) -> tuple[list[TurnRecord], dict[str, float]]:
        """The iteration's logged turns and deployment metrics."""
        cfg = self.config
        picks = self.sampler.choice(
            len(self.train_tasks), cfg.deploy.tasks_per_iteration, replace=False
        )
        batch = deploy(
            self.policy,
            self._make_env,
            [self.train_tasks[i] for i in picks],
            cfg.deploy,
            max_new_tokens=cfg.policy.max_new_tokens,
            seed=derive_seed(cfg.seed, "rollout", iteration),
            prefix=f"i{iteration}-",
        )
        self.conversations_deployed += len(batch.episodes)
        metrics = {
            "conversations": float(self.conversations_deployed),
            **episode_metrics(batch.episodes),
            "deploy_tokens": float(batch.sampled_tokens),
        }
        return batch.records, metrics

    def import_logs(self) -> tuple[list[TurnRecord], dict[str, float]]:
        """The imported conversations (tokenised with the policy's chat template) as the
        first iteration's batch, and its metrics."""
        assert self.conversations is not None and self.logged is not None
        records = self.logged
        self.conversations_deployed += len(self.conversations)
        outcomes = [c.outcome for c in self.conversations]
        return records, {
            "conversations": float(self.conversations_deployed),
            "return": float(np.mean(outcomes)),
            "turns": float(len(records) / len(self.conversations)),
            "logged_conversations": float(len(self.conversations)),
        }

    def fit_q(self, records: list[TurnRecord], iteration: int) -> tuple[QFit, dict[str, float]]:
        """Fit Q^pi to the logged returns; also score them with the previous Q."""
        cfg = self.config.q
        examples = q_examples(records, cfg.gamma)
        metrics: dict[str, float] = {}
        if self.previous_q is not None:
            pred = self.previous_q.predict(
                [e.context for e in examples], [e.response for e in examples]
            )
            target = np.array([e.target for e in examples])
            drift = q_quality(
                pred,
                target,
                loss=self.previous_q.loss,
                baseline=self.previous_q.target_mean
                if self.previous_q.loss == "mse"
                else float(np.mean(target)),
                bins=cfg.calibration_bins,
                states=[e.state for e in examples],
            )
            metrics.update({f"qprev_{k}": float(v) for k, v in drift.items() if k != "reliability"})
        seed = derive_seed(self.config.seed, "q_fit", iteration)
        if cfg.refit or self.q_model is None:
            self.q_model = build_q_model(
                init=cfg.init,
                seed=seed,
                hidden=cfg.hidden,
                layers=cfg.layers,
                policy=self.policy,
            )
        fit = fit_q(
            self.q_model,
            examples,
            loss=cfg.loss,
            steps=cfg.steps,
            lr=cfg.lr,
            batch_size=cfg.batch_size,
            holdout_fraction=cfg.holdout_fraction,
            calibration_bins=cfg.calibration_bins,
            seed=seed,
            pad_id=self.policy.pad_token_id,
        )
        self.previous_q = fit.q
        metrics.update(fit.metrics())
        metrics["q_bce"] = float(fit.q.loss == "bce")
        return fit, metrics

    def improve(self, records: list[TurnRecord], q: QFunction, iteration: int) -> dict[str, float]:
        """Single-turn GRPO against ``q`` on the logged states, KL to the deployed policy."""
        cfg = self.config.improve
        optimizer = self._optimizer()
        reference = self.policy.clone_frozen() if cfg.kl_coef > 0 else None
        malformed_score = cfg.malformed_score
        if malformed_score is None:  # the worst logged return-to-go (0 without logs)
            returns = mc_returns(records, self.config.q.gamma) if records else np.zeros(1)
            malformed_score = float(np.min(returns))
        return improve_policy(
            self.policy,
            optimizer,
            lambda contexts, responses: q.predict(contexts, responses),
            logged_states([r for r in records if r.prompt_ids]),
            cfg,
            max_new_tokens=self.config.policy.max_new_tokens,
            reference=reference,
            seed=derive_seed(self.config.seed, "improve", iteration),
            check=self._format_check() if cfg.reject_malformed else None,
            malformed_score=malformed_score,
            update=self._ppo_update(),
        )

    def _ppo_update(self) -> Callable[..., dict[str, float]]:
        """What runs the improvement step's PPO updates: ``ppo_update`` in one process
        (:mod:`turnrl.train.iterate.distributed` spreads it over torchrun ranks)."""
        return ppo_update

    def _optimizer(self) -> torch.optim.Optimizer:
        """The policy optimiser (one for the whole run, created on first use)."""
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(
                trainable(self.policy), lr=self.config.improve.lr, weight_decay=0.0
            )
        return self.optimizer

    def _format_check(self) -> FormatCheck | None:
        """The environment's pure action-syntax check for logged states of known tasks.

        ``None`` without an environment (logs only) or for one without
        :class:`~turnrl.types.ResponseChecks` (every response counts as well formed,
        as before environments declared the check). States of tasks the run does
        not know (imported logs) are not checked: the check may need the task
        (e.g. a negotiation's offer ranges).
        """
        if not self.has_env:
            return None
        env = self._make_env()
        if not isinstance(env, ResponseChecks):
            return None  # every response counts as well formed
        tasks = {task.task_id: task for task in self.train_tasks}

        def check(state: LoggedState, text: str) -> str | None:
            task = tasks.get(state.task_id)
            return None if task is None else env.check_response(task, text)

        return check

    # -------------------------------------------------------------------- run
    def _write_iteration(self, iteration: int, records: list[TurnRecord], fit: QFit) -> None:
        out = self.run_dir / f"iter-{iteration:03d}"
        out.mkdir(parents=True, exist_ok=True)
        returns = mc_returns(records, self.config.q.gamma)
        lines = [
            dumps_record(r, mc_return=float(g)) + "\n"
            for r, g in zip(records, returns, strict=True)
        ]
        atomic_write_text(out / "deploy.jsonl", "".join(lines))
        fit.q.save(out / "q")
        atomic_write_json(
            out / "q_quality.json",
            {
                "loss": fit.q.loss,
                "train": fit.train,
                "heldout": fit.heldout,
                "fit_losses": fit.losses,
            },
        )
        if self.config.save_policies:
            with replace_directory(out / "policy") as directory:
                self.policy.save(directory)

    def checkpoint(self) -> None:
        """Everything the next iteration needs, written atomically (Q is in iter-NNN/q)."""
        self.run_directory.save_checkpoint(
            self.iteration,
            self.policy.state_dict(),
            self._optimizer().state_dict(),
            {
                "sampler": self.sampler.bit_generator.state,
                "conversations_deployed": self.conversations_deployed,
            },
        )

    def _restore(self, checkpoint: Checkpoint) -> None:
        """Continue after the iteration ``checkpoint`` finished."""
        self.policy = self.run_directory.load_warm_start()
        self.policy.load_state_dict(checkpoint.model)
        self._optimizer().load_state_dict(checkpoint.optimizer)
        self.sampler.bit_generator.state = checkpoint.extra["sampler"]
        self.conversations_deployed = int(checkpoint.extra["conversations_deployed"])
        self.iteration = checkpoint.step
        self.previous_q = QFunction.load(self.run_dir / f"iter-{self.iteration:03d}" / "q")
        self.q_model = self.previous_q.model
        # Last: building the models above draws from the global generators.
        checkpoint.restore_rng()
        self.run_directory.log(f"resumed after iteration {self.iteration}")

    # ----------------------------------------------------- the Trainer phases
    @property
    def schedule(self) -> Schedule:
        """Every iteration evaluates and checkpoints; one log line each, no bar."""
        steps = self.config.iterations if self.has_env else 1
        return Schedule(steps, 1, 1, label="iterate", progress_bar=False)

    def setup(self, checkpoint: Checkpoint | None) -> int:
        """A fresh start (the warm start; imported logs become iteration 1's batch) or the
        state after the iteration ``checkpoint`` finished; the iterations done."""
        if checkpoint is not None:
            self._restore(checkpoint)
            return self.iteration
        cfg = self.config
        if self.conversations is None:
            self.policy = initial_policy(self.policy, cfg.warm_start, cfg.policy)
        else:  # the constructor loaded the initial policy to tokenise the logs
            self._imported = self.import_logs()
        self._warm_start(self._imported[0] if self._imported else None)
        return 0

    def start_metrics(self) -> dict[str, Any]:
        """The step-0 row: no conversation deployed yet, the warm start's evaluation."""
        return {"conversations": 0.0, **self.evaluate_policy()}

    def train_step(self, step: int) -> dict[str, Any]:
        """Iteration ``step``: deploy (or take the imported logs), fit Q, improve; its
        outputs under ``iter-NNN/``; the row without the evaluation."""
        started = time.perf_counter()
        if step == 1 and self._imported is not None:
            records, row = self._imported
        else:
            records, row = self.collect(step)
        t_deploy = time.perf_counter()
        fit, q_metrics = self.fit_q(records, step)
        t_q = time.perf_counter()
        improved = self.improve(records, fit.q, step)
        t_improve = time.perf_counter()
        self._write_iteration(step, records, fit)
        self.iteration = step
        return {
            "step": step,
            **row,
            **q_metrics,
            **improved,
            "seconds_deploy": t_deploy - started,
            "seconds_q": t_q - t_deploy,
            "seconds_improve": t_improve - t_q,
        }

    def evaluate(self) -> dict[str, float]:
        """The iteration's held-out evaluation (:meth:`evaluate_policy`) and its seconds."""
        started = time.perf_counter()
        return {**self.evaluate_policy(), "seconds_eval": time.perf_counter() - started}

    def describe(self, row: Mapping[str, Any]) -> str:
        """One progress line per iteration."""
        return describe_row(row)

    def finish(self) -> None:
        """Export the last improved policy as ``policy/`` (a Hugging Face model directory,
        as every trainer's; :mod:`turnrl.train.export`)."""
        super().finish()
        if not self.has_env and self.config.iterations > 1:
            self.run_directory.log("no environment configured: stopped after improving on the logs")


def describe_row(row: Mapping[str, Any]) -> str:
    """One progress line per iteration."""
    parts = [f"iteration {row['step']}", f"conversations {int(row.get('conversations', 0))}"]
    if "success" in row:
        parts.append(f"deal rate {row['success']:.2f}")
    if "return" in row:
        parts.append(f"value {row['return']:.3f}")
    if "q_heldout_spearman" in row:
        parts.append(f"Q rank corr {row['q_heldout_spearman']:.2f}")
    if "eval_return" in row:
        parts.append(f"eval value {row['eval_return']:.3f} (deal {row['eval_success']:.2f})")
    return "  ".join(parts)
