"""The sampler process of ``train.max_staleness >= 1``: its own copy of the weights, the
built-in environments, and the independent strategy's episodes, run while the learner
updates (docs/async.md).

One child process (``torch.multiprocessing``: forked from a CPU learner on Linux, else
spawned; one torch thread) reads one queue in order: ``weights`` messages (a state dict
whose tensors the learner copied once into shared memory: the push costs that copy and
nothing else) and ``sample`` requests (a step's tasks and seed). Because it reads them
in the order the learner sent them, a request is sampled with exactly the version pushed
before it: the schedule of :mod:`turnrl.train.staleness` holds whatever the timing, so
an asynchronous run is reproducible. Each step's episodes come back whole (records
tagged with the version, episodes without their environments, costs) on a second queue,
with how long the sampler waited before starting it.

What samples: a transformers copy (``policy.backend = "hf"``), a vLLM engine
(``"vllm"``) started inside the sampler process from its own transformers copy, which it
then drops (the engine holds the weights; each push reloads them in place and drops the
engine's prefix cache, :meth:`turnrl.policy.vllm.VLLMPolicy.load_full_weights`), or a
vLLM server the user runs (``"vllm-server"``), through its client. The server cannot
take tensors from memory, so the sampler process keeps its transformers copy (LoRA
adapters unmerged, as the learner's): each push is loaded into the copy and handed on
from it as the synchronous trainer hands on the learner's
(:func:`turnrl.policy.sync.push_weights`: adapters for a LoRA learner, else full
weights), between the same requests, so the schedule holds on the server too. A vLLM
engine's sampler is spawned, never forked: the learner holds an engine of its own (for
evaluation) with threads running, and a fork copies none of those threads, only locks they
may hold.

Failures: the learner waits for a step with a timeout and checks that the process
lives; a sampler that died (killed, out of memory) or raised is a
:class:`SamplerProcessError`, one line naming it (exit code 2): the run stops, and
``--resume`` continues from its last checkpoint. The child dies with the learner
(``PR_SET_PDEATHSIG``) and also leaves when its parent is gone, so no process is left
behind.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import queue
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from turnrl.errors import TurnrlError
from turnrl.rollout.runner import Episode, RolloutBatch
from turnrl.types import Task

__all__ = [
    "SampledStep",
    "SamplerProcess",
    "SamplerProcessError",
    "SamplerSpec",
    "child_reply",
    "parent_messages",
    "shared_copy",
    "stop_child",
]

POLL_S = 0.2
"""How often a waiting learner checks that the sampler lives."""
STOP_WAIT_S = 10.0
"""How long closing waits for the sampler to leave before it is killed."""


class SamplerProcessError(TurnrlError, RuntimeError):
    """The sampler process died or failed; the message names it and how to resume."""


@dataclass(frozen=True)
class SamplerSpec:
    """What the sampler process builds: its policy (``policy`` is the run's
    ``PolicyConfig``, without LoRA where it receives merged weights: all but a vLLM
    server's copy) and environment."""

    policy: Any
    seed: int
    env_name: str
    env_kwargs: Mapping[str, Any]
    max_new_tokens: int
    temperature: float
    group_size: int
    prefix_cache: bool
    per_episode_seeds: bool
    max_context_tokens: int = 0
    """``rollout.max_context_tokens``: the per-turn context cap the learner's own
    rollouts would sample under (:mod:`turnrl.rollout.context_cap`); 0: none."""
    env_spec: Any = None
    """The ``EnvSpec`` registered as ``env_name`` in the learner, for a spawned sampler:
    it starts without what the learner's code registered at run time
    (:func:`turnrl.envs.register_env`); None where it is forked (it has them)."""
    rows: int = 0
    """The most rows one sampling call has (a step's tasks x group size): sizes a vLLM
    engine's token budget (:func:`turnrl.policy.vllm.batch_token_budget`); 0: unknown."""
    weights_dir: str = ""
    """A vLLM server's pushes are staged here (the learner makes and removes it, so a
    killed sampler leaves nothing behind); "": the client's own temporary one."""


@dataclass(frozen=True)
class SampleRequest:
    """One step's rollouts: its tasks, sampling seed and trajectory-id prefix."""

    step: int
    tasks: tuple[Task, ...]
    seed: int
    traj_prefix: str
    owned: tuple[int, int] | None = None
    """Under torchrun: the task slots ``[start, stop)`` this rank samples (the episodes of
    those tasks in the step's plan, each with its own seed); None: every episode."""


@dataclass
class SampledStep:
    """A step's finished episodes, sampled with weights ``version``."""

    step: int
    version: int
    batch: RolloutBatch
    idle_s: float = 0.0
    """Seconds the sampler waited (for a request or weights) before starting this step."""
    task_ids: tuple[str, ...] = field(default_factory=tuple)


# ------------------------------------------------------------------- the child process


def _without_env(episode: Episode) -> Episode:
    """The episode as a step's metrics read it, without its environment and context
    (they stay in the sampler)."""
    return dataclasses.replace(episode, env=None, context=[])  # type: ignore[arg-type]


def _sample(policy: Any, spec: SamplerSpec, request: SampleRequest, version: int) -> RolloutBatch:
    """The independent strategy's episodes of one step, as the learner's runner would
    sample them (same seeds, same trajectory ids), records tagged with ``version``."""
    from turnrl.envs import make_env
    from turnrl.rollout.context_cap import cap_context
    from turnrl.rollout.runner import plan_episodes, run_episodes, run_planned_episodes
    from turnrl.rollout.tokens import PrefixReuse

    counting = PrefixReuse(cap_context(policy, spec.max_context_tokens), enabled=spec.prefix_cache)
    env = partial(make_env, spec.env_name, **spec.env_kwargs)
    sampling = {"max_new_tokens": spec.max_new_tokens, "temperature": spec.temperature}
    if request.owned is None:
        batch = run_episodes(
            counting,
            env,
            list(request.tasks),
            group_size=spec.group_size,
            seed=request.seed,
            traj_prefix=request.traj_prefix,
            per_episode_seeds=spec.per_episode_seeds,
            **sampling,
        )
    else:  # a rank's share: as DistributedOnlineTrainer samples it in step with the update
        start, stop = request.owned
        plan = plan_episodes(list(request.tasks), spec.group_size, request.traj_prefix)
        planned = [
            (k, task, traj)
            for k, (task, traj) in enumerate(plan)
            if start <= k // spec.group_size < stop
        ]
        batch = run_planned_episodes(counting, env, planned, seed=request.seed, **sampling)
    batch.records = [dataclasses.replace(r, policy_version=version) for r in batch.records]
    batch.episodes = [_without_env(e) for e in batch.episodes]
    batch.extra["tokens_computed"] = counting.tokens_computed
    batch.extra["policy_version"] = version
    return batch


def _load(
    sampler: Any, copy: Any, state: Mapping[str, torch.Tensor], version: int, first: bool
) -> None:
    """Give the sampler's weights the pushed ``state`` (the model's state dict under its
    transformers names): reloaded in place in a vLLM engine, loaded into a transformers
    copy; for a vLLM server, loaded into ``copy`` and handed on from it. A server copy's
    push after the ``first`` may leave out the copy's frozen weights (a LoRA learner
    pushes its adapters alone once the base is there), nothing else."""
    if copy is not None:
        from turnrl.policy.sync import push_weights

        _check_partial_push(copy.model, state, first)
        copy.model.load_state_dict(state, strict=first)
        push_weights(copy, sampler, version)
        return
    reload = getattr(sampler, "load_full_weights", None)
    if reload is not None:
        reload(state, version)
    else:
        sampler.model.load_state_dict(state)


def _check_partial_push(model: Any, state: Mapping[str, torch.Tensor], first: bool) -> None:
    """Refuse a push ``model`` cannot take whole: a name it does not have, or, after
    the ``first`` push, one of its trained weights left out (the frozen ones may be)."""
    own = model.state_dict().keys()
    unknown = sorted(set(state) - set(own))
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    left_out = sorted((set(own) if first else trained) - set(state))
    if unknown or left_out:
        raise KeyError(
            f"a push the server's copy cannot take: unknown {unknown[:3]}, left out {left_out[:3]}"
        )


def _register_env(spec: SamplerSpec) -> None:
    """Register the learner's environment here where it is not (a spawned sampler)."""
    from turnrl.envs import ENVS, register_env

    if spec.env_spec is not None and spec.env_name not in ENVS:
        register_env(spec.env_name, spec.env_spec)


def _build_sampler(spec: SamplerSpec) -> tuple[Any, Any]:
    """What this process samples with, and the copy pushes go through (None where the
    sampler takes them itself): its transformers copy; a vLLM engine started from it
    (the copy is then dropped: the engine holds the weights); or a vLLM server's client,
    which keeps the copy (module docstring)."""
    from turnrl.policy.factory import build_policy, build_sampler

    policy = build_policy(spec.policy, spec.seed)
    policy.model.eval()
    if spec.policy.backend != "vllm-server":
        return build_sampler(spec.policy, policy, rows=spec.rows or None), None
    staging = {"weights_dir": spec.weights_dir} if spec.weights_dir else {}
    return build_sampler(spec.policy, policy, **staging), policy


def parent_messages(inbox: Any, parent: int) -> Iterator[tuple[Any, ...]]:
    """A child's messages from its parent ``parent`` (a pid), in order, until one says
    ``stop`` or the parent is gone."""
    while True:
        try:
            message = inbox.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:
                return
            continue
        if message[0] == "stop":
            return
        yield message
        del message  # a pushed state's shared memory is not held while waiting


def _serve(spec: SamplerSpec, inbox: Any, outbox: Any, parent: int) -> None:
    """The sampler's loop (the child's entry point; see the module docstring)."""
    from turnrl.policy.factory import close_sampler
    from turnrl.train.process_tree import die_with_parent

    die_with_parent(parent)
    torch.set_num_threads(1)
    _register_env(spec)
    policy: Any = None
    version: int | None = None
    step = 0
    try:
        policy, copy = _build_sampler(spec)
        idle_since = time.perf_counter()
        for message in parent_messages(inbox, parent):
            kind = message[0]
            if kind == "weights":
                first = version is None
                _, version, state = message
                _load(policy, copy, state, version, first)
                del state, message
                outbox.put(("loaded", version))
                continue
            request: SampleRequest = message[1]
            step = request.step
            idle = time.perf_counter() - idle_since
            assert version is not None, "a request before any weights"
            batch = _sample(policy, spec, request, version)
            task_ids = tuple(t.task_id for t in request.tasks)
            outbox.put(("sampled", SampledStep(step, version, batch, idle, task_ids)))
            idle_since = time.perf_counter()
    except BaseException as err:  # said to the learner in one line; it stops the run
        outbox.put(("failed", step, f"{type(err).__name__}: {err}"))
    finally:
        close_sampler(None, policy)  # a vLLM engine's core and its temporary weights


# ------------------------------------------------------------------- the learner's side


def shared_copy(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each tensor copied once into a new shared-memory CPU tensor (what crosses to the
    sampler; the learner's own weights are never shared, so its updates stay its own)."""
    out = {}
    for name, tensor in state.items():
        shared = torch.empty(tensor.shape, dtype=tensor.dtype).share_memory_()
        shared.copy_(tensor.detach())
        out[name] = shared
    return out


def _quiet_peer_deaths(hook: Any) -> Any:
    """``sys.excepthook`` less the tracebacks multiprocessing's resource sharer prints
    (from its own thread, through ``sys.excepthook``) when the process it hands a shared
    tensor's file descriptor to dies mid-handshake: a killed sampler, which the trainer
    reports itself in one line. Every other exception goes to ``hook``."""

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        frames = traceback.extract_tb(tb)
        from_sharer = bool(frames) and frames[0].filename.endswith("resource_sharer.py")
        if from_sharer and issubclass(kind, EOFError | ConnectionError):
            return
        hook(kind, value, tb)

    excepthook.quiet_peer_deaths = True  # type: ignore[attr-defined]
    return excepthook


def quiet_peer_deaths() -> None:
    """Install :func:`_quiet_peer_deaths` on ``sys.excepthook`` (once): a parent whose
    child may die while it hands the child shared tensors (the sampler process, the
    served copy) says that death in its own one line."""
    if not getattr(sys.excepthook, "quiet_peer_deaths", False):
        sys.excepthook = _quiet_peer_deaths(sys.excepthook)


def child_reply(process: Any, outbox: Any, died: Callable[[], Exception]) -> Any:
    """A child's next reply on ``outbox``, waiting for it; ``died()`` is raised if the
    child ends first (checked every ``POLL_S``)."""
    while True:
        try:
            return outbox.get(timeout=POLL_S)
        except queue.Empty:
            if not process.is_alive():
                raise died() from None


def stop_child(process: Any, inbox: Any, outbox: Any) -> None:
    """Ask a child that reads ``inbox`` to stop (``("stop",)``), wait for it (killed if
    it does not leave within ``STOP_WAIT_S``), and close both queues without waiting
    for what they still hold."""
    if process.is_alive():
        inbox.put(("stop",))
        process.join(STOP_WAIT_S)
    if process.is_alive():
        process.kill()
    process.join()
    for channel in (inbox, outbox):
        channel.cancel_join_thread()
        channel.close()


class SamplerProcess:
    """The learner's handle on the sampler process (see the module docstring)."""

    def __init__(self, spec: SamplerSpec) -> None:
        import torch.multiprocessing as mp

        quiet_peer_deaths()

        # fork where the learner is on the CPU (Linux): the child starts in a second,
        # where a spawned one first imports torch and transformers again (10 s of CPU);
        # it sets one torch thread before any torch work. CUDA cannot be forked, nor can
        # a learner running a vLLM engine's threads (module docstring): spawn. A vLLM
        # server's learner runs no engine (it evaluates with itself).
        fork = (
            sys.platform.startswith("linux")
            and not torch.cuda.is_initialized()
            and getattr(spec.policy, "backend", "hf") in ("hf", "vllm-server")
        )
        if not fork:
            from turnrl.envs import get_env_spec

            spec = dataclasses.replace(spec, env_spec=get_env_spec(spec.env_name))
        context = mp.get_context("fork" if fork else "spawn")
        self._inbox = context.Queue()
        self._outbox = context.Queue()
        self._process = context.Process(
            target=_serve,
            args=(spec, self._inbox, self._outbox, os.getpid()),
            name="turnrl-sampler",
            daemon=True,
        )
        try:
            self._process.start()
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            raise SamplerProcessError(
                f"the sampler process could not be started: what it needs from this process "
                f"(env.name = {spec.env_name!r}'s EnvSpec, the policy settings) cannot be "
                f"sent to a spawned process ({type(err).__name__}: {err}); define the "
                "environment's classes and functions at a module's top level"
            ) from None
        self._finished: dict[int, SampledStep] = {}
        self._pushed: dict[int, dict[str, torch.Tensor]] = {}
        """Shared copies not yet loaded by the sampler (kept alive until it says so)."""

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    def push(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        """Send the weights of ``version``; requests sent after it sample with them."""
        shared = shared_copy(state)
        self._pushed[version] = shared
        self._inbox.put(("weights", version, shared))

    def request(
        self,
        step: int,
        tasks: Sequence[Task],
        seed: int,
        traj_prefix: str,
        owned: tuple[int, int] | None = None,
    ) -> None:
        """Ask for step ``step``'s episodes (sampled with the last weights pushed); under
        torchrun those of the task slots ``owned``."""
        request = SampleRequest(step, tuple(tasks), seed, traj_prefix, owned)
        self._inbox.put(("sample", request))

    def receive(self, step: int) -> tuple[SampledStep, float]:
        """Step ``step``'s episodes, waiting for them; and the seconds waited. Raises
        :class:`SamplerProcessError` when the sampler died or failed."""
        started = time.perf_counter()

        def died() -> SamplerProcessError:
            return SamplerProcessError(
                f"the sampler process (pid {self.pid}) ended with exit code "
                f"{self._process.exitcode} while step {step} was sampling; the run "
                "stopped (continue it with --resume)"
            )

        while step not in self._finished:
            self._take(child_reply(self._process, self._outbox, died), step)
        return self._finished.pop(step), time.perf_counter() - started

    def _take(self, message: tuple[Any, ...], waiting_for: int) -> None:
        kind = message[0]
        if kind == "loaded":
            for version in [v for v in self._pushed if v <= message[1]]:
                del self._pushed[version]
        elif kind == "sampled":
            self._finished[message[1].step] = message[1]
        else:
            _, step, what = message
            raise SamplerProcessError(
                f"the sampler process (pid {self.pid}) failed at step {step or waiting_for}: "
                f"{what}; the run stopped (continue it with --resume once fixed)"
            )

    def close(self) -> None:
        """Stop the sampler and wait for it (killed if it does not leave in time)."""
        stop_child(self._process, self._inbox, self._outbox)
        self._pushed.clear()
