"""Rollout workers on Ray: environments and sampling in actors, weights pushed after updates.

``RayRolloutPool(policy_factory, env_name, env_kwargs, workers=N)`` starts ``N`` Ray
actors. Each builds its own policy copy with ``policy_factory()`` and its environments
by name (``turnrl.envs.make_env``), so only weights, tasks and finished episodes cross
process boundaries. Without ``address`` the pool uses the Ray instance this process
already runs, or starts a local one; with ``address`` it joins that cluster.

Weights. ``push_weights(state_dict, version)`` stores the weights in Ray's object store
once and has every worker load them; versions must increase. ``run`` refuses to sample
before the first push (the factory's weights need not be the learner's), and every
record it returns carries ``policy_version``: the version its worker had loaded.

Determinism. Episode ``k`` of a batch samples with its own seed ``episode_seed(seed, k)``
(``Episode.seed`` in :mod:`turnrl.rollout.runner`), so how the batch is split does not
change which tokens an episode draws. ``run`` returns what
``run_episodes(..., per_episode_seeds=True)`` returns in process: the same episodes and
trajectory ids, the same records in the same order, with identical tokens, rewards and
flags; log-probs agree up to float rounding, because a worker's batch holds fewer rows
(a different padding width changes the summation order of the forward pass). Float
rounding could in principle flip a sampled token whose cumulative probability sits
within ~1e-6 of the uniform draw; it does not happen in the tests.

Sharding. The batch is cut into contiguous chunks of at most ``episodes_per_call``
episodes (default: one chunk per worker) and chunk ``c`` goes to worker ``c % N``.
Chunks depend only on the batch size, ``workers`` and ``episodes_per_call``, never on
timing, so re-running a chunk reproduces it bit for bit.

Failures. When a worker dies (``ray.exceptions.RayActorError``), it is replaced by a
fresh actor that first loads the current weights and version, and every chunk it had
not returned is re-run there from scratch with the same seeds. A chunk's records are
accepted only when the whole chunk comes back, with each of its episodes finished and
present exactly once, so no episode is counted twice or lost, and the batch equals the
one without the failure. ``max_restarts`` bounds the replacements within one ``run``.
Exceptions raised inside a worker (a bug in an environment, say) are not retried.

Training. ``train_with_workers(config)`` runs ``OnlineTrainer`` with a pool built from
``rollout.workers`` and ``rollout.ray_address``: workers load the run's saved
``warm_start/`` policy (as a resumed run does) and then receive the weights before the
first step and after every update (version = updates applied so far).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from turnrl.envs import make_env
from turnrl.policy.factory import load_policy
from turnrl.rollout.context_cap import build_capped
from turnrl.rollout.runner import RolloutBatch, plan_episodes, run_planned_episodes
from turnrl.train.config import RunConfig
from turnrl.train.online.trainer import OnlineTrainer
from turnrl.types import Env, Policy, Task

PlannedEpisode = tuple[int, Task, str]
"""``(episode index in the batch, task, traj_id)``."""


def require_ray() -> Any:
    """The ``ray`` module, or an ImportError saying how to install it."""
    try:
        import ray
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "rollout workers need Ray: pip install 'turnrl[ray]' (or set rollout.workers = 0)"
        ) from error
    return ray


def shard(
    plan: Sequence[PlannedEpisode], workers: int, episodes_per_call: int | None
) -> list[list[PlannedEpisode]]:
    """Contiguous chunks of ``plan``: ``episodes_per_call`` each, or one per worker."""
    if not plan:
        return []
    size = episodes_per_call or -(-len(plan) // workers)
    return [list(plan[i : i + size]) for i in range(0, len(plan), size)]


class RolloutWorker:
    """What one Ray actor holds: a policy copy, its weights' version, an env factory."""

    def __init__(
        self,
        policy_factory: Callable[[], Policy],
        env_name: str,
        env_kwargs: Mapping[str, Any],
        threads: int,
    ) -> None:
        if threads > 0:
            import torch

            torch.set_num_threads(threads)
        self.policy = policy_factory()
        model = getattr(self.policy, "model", None)
        if model is not None:
            model.eval()
        self.make_env: Callable[[], Env] = partial(make_env, env_name, **env_kwargs)
        self.version: int | None = None

    def load_weights(self, state_dict: Mapping[str, Any], version: int) -> int:
        """Load pushed weights; return the version now held."""
        self.policy.load_state_dict(state_dict)  # type: ignore[attr-defined]
        self.version = version
        return version

    def pid(self) -> int:
        """The worker's process id (for tests and diagnostics)."""
        return os.getpid()

    def run(
        self,
        chunk: Sequence[PlannedEpisode],
        *,
        seed: int,
        max_new_tokens: int,
        temperature: float,
        max_turns: int,
    ) -> tuple[RolloutBatch, int | None]:
        """Run the chunk's episodes to the end in one batch; tag records with the version.

        Returns the batch and the weights' version it was sampled with;
        ``batch.extra["tokens_computed"]`` counts the positions the model ran, when the
        policy counts them (``HFPolicy.tokens_computed``).
        """
        before = getattr(self.policy, "tokens_computed", None)
        batch = run_planned_episodes(
            self.policy,
            self.make_env,
            chunk,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            max_turns=max_turns,
        )
        batch.records = [dataclasses.replace(r, policy_version=self.version) for r in batch.records]
        after = getattr(self.policy, "tokens_computed", None)
        if before is not None and after is not None:
            batch.extra["tokens_computed"] = after - before
        return batch, self.version


@dataclass
class _Slot:
    """One worker position: its current actor and how many actors it has had."""

    actor: Any
    generation: int = 0


@dataclass
class _Call:
    chunk: int
    slot: int
    generation: int


@dataclass
class PoolStats:
    """Counters over the pool's lifetime."""

    restarts: int = 0
    """Workers replaced after dying."""
    rerun_chunks: int = 0
    """Chunks re-run because their worker died before returning them."""
    pushes: list[int] = field(default_factory=list)
    """Versions pushed, in order."""


class RayRolloutPool:
    """``workers`` Ray actors that run independent episodes with pushed, versioned weights.

    ``policy_factory`` (picklable; called once in every worker) builds a policy with
    ``load_state_dict``, e.g. ``functools.partial(build_tiny_policy, 0)``. Environments
    are ``make_env(env_name, **env_kwargs)``. ``threads`` sets torch's threads per
    worker (0 leaves the default); ``actor_options`` go to ``ray.remote`` (default
    ``{"num_cpus": 1}``; e.g. ``{"num_gpus": 1}`` on a cluster). ``address`` joins a
    running cluster (``"auto"`` or ``"ray://host:10001"``); without it, an already
    initialised Ray is used, else a local one is started (and shut down by ``close``).
    Starting a worker and loading weights must finish within ``load_timeout_s``
    (a cluster without room for the workers would otherwise wait forever).
    """

    def __init__(
        self,
        policy_factory: Callable[[], Policy],
        env_name: str,
        env_kwargs: Mapping[str, Any] | None = None,
        *,
        workers: int,
        address: str | None = None,
        episodes_per_call: int | None = None,
        max_restarts: int = 3,
        threads: int = 1,
        actor_options: Mapping[str, Any] | None = None,
        load_timeout_s: float = 600.0,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if episodes_per_call is not None and episodes_per_call < 1:
            raise ValueError(f"episodes_per_call must be >= 1 or None, got {episodes_per_call}")
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        ray = require_ray()
        self._ray = ray
        self._owns_ray = False
        options = {"num_cpus": 1, **(actor_options or {})}
        self._options = options
        if address is not None:
            ray.init(address=address, ignore_reinit_error=True)
        elif not ray.is_initialized():
            # Logical CPUs: enough for every worker even on a small machine.
            cpus = max(os.cpu_count() or 1, int(workers * options["num_cpus"]))
            ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
            self._owns_ray = True
        # The pool replaces dead actors itself (with the current weights), so Ray must not.
        self._actor_class = ray.remote(max_restarts=0, max_task_retries=0, **options)(RolloutWorker)
        self._init_args = (policy_factory, env_name, dict(env_kwargs or {}), threads)
        self.workers = workers
        self.episodes_per_call = episodes_per_call
        self.max_restarts = max_restarts
        self.load_timeout_s = load_timeout_s
        self.stats = PoolStats()
        self._weights: Any = None
        self._version: int | None = None
        self._slots: list[_Slot] = []
        """Started by the first ``push_weights``, so every actor starts with known weights."""

    # ----------------------------------------------------------------- actors
    def _new_actor(self) -> Any:
        """A started actor holding the current weights."""
        actor = self._actor_class.remote(*self._init_args)
        self._await_load(actor.load_weights.remote(self._weights, self._version))
        return actor

    def _await_load(self, ref: Any) -> None:
        try:
            self._ray.get(ref, timeout=self.load_timeout_s)
        except self._ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"a rollout worker did not start and load weights within {self.load_timeout_s} s; "
                f"does the Ray cluster have room for {self.workers} workers "
                f"({self._options})? {self._ray.available_resources()} available"
            ) from None

    def _replace(self, slot: int) -> None:
        """A fresh actor in ``slot`` holding the current weights."""
        self.stats.restarts += 1
        self._kill(self._slots[slot].actor)
        self._slots[slot] = _Slot(self._new_actor(), self._slots[slot].generation + 1)

    def _kill(self, actor: Any) -> None:
        with contextlib.suppress(Exception):  # already gone
            self._ray.kill(actor, no_restart=True)

    def actor(self, slot: int) -> Any:
        """The Ray actor handle now in ``slot`` (for tests and diagnostics)."""
        return self._slots[slot].actor

    @property
    def version(self) -> int | None:
        """The version of the weights every worker holds (``None`` before the first push)."""
        return self._version

    # ---------------------------------------------------------------- weights
    def push_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Send ``state_dict`` to every worker (one copy in the object store) as ``version``.

        The first push starts the workers. Returns when all workers hold the
        weights; a worker that dies meanwhile is replaced.
        """
        if self._version is not None and version <= self._version:
            raise ValueError(
                f"push_weights: version {version} must be greater than the current {self._version}"
            )
        cpu = {
            k: v.detach().to("cpu") if hasattr(v, "detach") else v for k, v in state_dict.items()
        }
        self._weights = self._ray.put(cpu)
        self._version = version
        self.stats.pushes.append(version)
        if not self._slots:
            actors = [self._actor_class.remote(*self._init_args) for _ in range(self.workers)]
            self._slots = [_Slot(actor) for actor in actors]
        loads = [s.actor.load_weights.remote(self._weights, version) for s in self._slots]
        for slot, ref in enumerate(loads):
            try:
                self._await_load(ref)
            except self._ray.exceptions.RayActorError:
                self._replace(slot)

    # ------------------------------------------------------------------- run
    def run(
        self,
        tasks: Sequence[Task],
        *,
        group_size: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        traj_prefix: str = "",
        max_turns: int = 32,
    ) -> RolloutBatch:
        """``group_size`` episodes per task on the workers; the batch in-process
        ``run_episodes(..., per_episode_seeds=True)`` would return (see module doc)."""
        if self._weights is None:
            raise RuntimeError(
                "RayRolloutPool.run: call push_weights(state_dict, version) first; workers "
                "start with the factory's weights, which need not be the learner's"
            )
        started = time.perf_counter()
        plan = [
            (k, task, traj)
            for k, (task, traj) in enumerate(plan_episodes(tasks, group_size, traj_prefix))
        ]
        chunks = shard(plan, self.workers, self.episodes_per_call)
        options = {
            "seed": seed,
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "max_turns": max_turns,
        }

        def submit(c: int, slot: int) -> tuple[Any, _Call]:
            s = self._slots[slot]
            return s.actor.run.remote(chunks[c], **options), _Call(c, slot, s.generation)

        pending = dict(submit(c, c % self.workers) for c in range(len(chunks)))
        done: dict[int, RolloutBatch] = {}
        restarts = 0
        while pending:
            (ref,), _ = self._ray.wait(list(pending), num_returns=1)
            call = pending.pop(ref)
            try:
                part, version = self._ray.get(ref)
            except self._ray.exceptions.RayActorError as error:
                if self._slots[call.slot].generation == call.generation:
                    restarts += 1
                    if restarts > self.max_restarts:
                        raise RuntimeError(
                            f"RayRolloutPool.run: more than {self.max_restarts} workers died "
                            "in one batch"
                        ) from error
                    self._replace(call.slot)
                self.stats.rerun_chunks += 1
                new_ref, new_call = submit(call.chunk, call.slot)
                pending[new_ref] = new_call
                continue
            _check_chunk(chunks[call.chunk], part, version, self._version)
            done[call.chunk] = part
        batch = _merge([done[c] for c in range(len(chunks))], plan)
        batch.extra.update(
            policy_version=self._version,
            workers=self.workers,
            worker_restarts=restarts,
            seconds_wall=time.perf_counter() - started,
        )
        return batch

    def run_episodes(
        self, policy: Policy, make_env: Callable[[], Env], tasks: Sequence[Task], **options: Any
    ) -> RolloutBatch:
        """:func:`turnrl.rollout.run_episodes` for ``StrategyContext.runner``: :meth:`run`
        on the workers, with its keyword options (``run_episodes``' own, less
        ``per_episode_seeds``: pool episodes always have their own seeds).

        ``policy`` and ``make_env`` are not used: the workers hold their own copies
        (with the pushed weights) and build environments from the pool's env name.
        """
        del policy, make_env
        return self.run(tasks, **options)

    # ---------------------------------------------------------------- closing
    def close(self) -> None:
        """Stop the workers (and the local Ray instance if this pool started it)."""
        for slot in self._slots:
            self._kill(slot.actor)
        self._slots = []
        if self._owns_ray:
            self._ray.shutdown()
            self._owns_ray = False

    def __enter__(self) -> RayRolloutPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_chunk(
    chunk: Sequence[PlannedEpisode], part: RolloutBatch, version: int | None, expected: int | None
) -> None:
    """Accept a chunk only if every planned episode came back once, finished, with
    contiguous turns, sampled with the current weights."""
    planned = [traj for _, _, traj in chunk]
    returned = [e.traj_id for e in part.episodes]
    if returned != planned:
        raise RuntimeError(f"worker returned episodes {returned}, expected {planned}")
    if version != expected:
        raise RuntimeError(f"worker sampled with weights version {version}, expected {expected}")
    turns: dict[str, list[int]] = {traj: [] for traj in planned}
    for record in part.records:
        turns[record.traj_id].append(record.turn)
    for episode in part.episodes:
        if not episode.done or turns[episode.traj_id] != list(range(episode.turn)):
            raise RuntimeError(f"worker returned an unfinished episode {episode.traj_id!r}")


def _merge(parts: Sequence[RolloutBatch], plan: Sequence[PlannedEpisode]) -> RolloutBatch:
    """One batch from the chunks, ordered as the in-process runner orders it:
    episodes by index, records by (turn, episode index). Costs are summed over
    workers (so the seconds are worker seconds, not wall-clock seconds), and so is
    ``extra["tokens_computed"]`` when every worker counts it."""
    index = {traj: k for k, _, traj in plan}
    records = [r for part in parts for r in part.records]
    records.sort(key=lambda r: (r.turn, index[r.traj_id]))
    computed = [p.extra.get("tokens_computed") for p in parts]
    extra = {} if None in computed else {"tokens_computed": sum(computed)}
    return RolloutBatch(
        records=records,
        episodes=[e for part in parts for e in part.episodes],
        sampled_tokens=sum(p.sampled_tokens for p in parts),
        context_tokens=sum(p.context_tokens for p in parts),
        seconds_sampling=sum(p.seconds_sampling for p in parts),
        seconds_env=sum(p.seconds_env for p in parts),
        extra=extra,
    )


def pool_for_config(
    config: RunConfig, *, policy_factory: Callable[[], Policy] | None = None
) -> RayRolloutPool:
    """The pool ``rollout.workers`` and ``rollout.ray_address`` ask for.

    Workers build their policy with ``policy_factory``; the default loads the run's
    ``warm_start/`` directory (through :func:`turnrl.policy.factory.load_policy`, on
    ``policy.device`` in ``policy.dtype``) (written by the trainer before its first push, and read
    by the workers only then), so on a cluster the run directory must be on a
    filesystem every node sees. Their policy's context is capped at
    ``rollout.max_context_tokens`` when the run sets it (:mod:`turnrl.rollout.context_cap`).
    """
    factory = policy_factory or partial(
        load_policy, str(Path(config.run_dir) / "warm_start"), config.policy
    )
    cap = config.rollout.max_context_tokens
    return RayRolloutPool(
        partial(build_capped, factory, cap) if cap else factory,  # no cap: the factory as is
        config.env.name,
        config.env.env_kwargs,
        workers=config.rollout.workers,
        address=config.rollout.ray_address,
        threads=config.train.threads if config.train.threads > 0 else 1,
    )


def train_with_workers(
    config: RunConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    quiet: bool = False,
    report: Callable[[Path], None] | None = None,
) -> Path:
    """Run ``OnlineTrainer`` with Ray rollout workers through its
    :class:`~turnrl.train.lifecycle.Lifecycle` (``report``: called with the run directory
    once the run is done); returns the run directory."""
    from turnrl.train.lifecycle import Lifecycle

    with pool_for_config(config) as pool:
        trainer = OnlineTrainer(config, resume=resume, overwrite=overwrite, quiet=quiet, pool=pool)
        return Lifecycle(trainer, report=report).run()
