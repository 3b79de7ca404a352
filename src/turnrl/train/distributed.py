"""The learner on several processes: ``torch.distributed`` ranks launched by ``torchrun``.

``torchrun --nproc-per-node N -m turnrl.cli train --config X`` starts N copies of the
command; torchrun tells each its place through the ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` environment variables, which :func:`world_from_env` reads (none set:
one process, and nothing here is used). This module (and :mod:`turnrl.train.fsdp`,
for FSDP2) is the only one that talks to ``torch.distributed``: the process group
(gloo on CPU, NCCL on CUDA), which tasks of a step a rank owns, the gradient sum,
the collectives the trainer needs, and turning a lost peer into one clear error.
What the ranks do with it is :mod:`turnrl.train.online.ranks` (built-in
environments) and :mod:`turnrl.train.agent.distributed` (the agent loop);
docs/distributed.md is the user's guide.

Gradients: ``torch.distributed.all_reduce`` on ``.grad`` after the backward passes of
a mini-batch (torch.distributed's own collective), not ``DistributedDataParallel``
(the choice is argued in docs/distributed.md). DDP reduces inside autograd hooks,
so every rank must run the same number of backward passes per optimiser step
through the DDP-wrapped module. turnrl's update does not fit that: a mini-batch is
a set of whole task trees drawn over the global batch, a rank may hold none of them
in a given step (zero forwards) or several (the tree layout cuts forwards at
``max_tokens_per_batch``, a number that differs between ranks), and the tree layout
calls the inner model with its own attention masks through ``HFPolicy``, not
through a wrapper. Summing ``.grad`` once per optimiser step, as cleanrl's
multi-GPU PPO does, is the same traffic as DDP's final bucket, works for any count
of forwards per rank and for LoRA (only the trainable adapter tensors travel), and
keeps one code path for one and N processes. The loss weights of every rank are
already its slice of the global batch's (:data:`turnrl.train.update.loss.CountReducer`), so
the gradients are **summed**, not averaged: the sum is the gradient one process
computes on the global batch (DDP would average, and would need dummy forwards
to equalise the counts). A parameter no rank produced a gradient for keeps
``grad = None`` (AdamW then skips it, as in one process).

FSDP2 sharding (``train.sharding = "fsdp2"``, ``fully_shard``) is
:mod:`turnrl.train.fsdp`: there FSDP2's own reduce-scatter sums the gradients, and
:func:`reduce_gradients` is not used.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

import torch

from turnrl.errors import TurnrlError, UsageError

T = TypeVar("T")

ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
"""What torchrun sets in every process it starts."""

EXIT_RANK_LOST = 3
"""Exit status of a rank whose run ended because another rank stopped."""

DEFAULT_TIMEOUT_S = 1800.0
"""How long a collective waits for the other ranks (rank 0 alone evaluates and writes
checkpoints meanwhile); overridden by ``TURNRL_DIST_TIMEOUT_S``."""


class RankLost(TurnrlError):
    """Another rank stopped (killed, crashed, or its machine gone): the run ends here.
    Nothing is half-written (checkpoints and logs are atomic); ``--resume`` continues
    from the last checkpoint."""


class StoppedByRankZero(Exception):
    """Rank 0 stopped the run and says why itself (one line, or its traceback), and its
    exit status is the run's: this rank ends without a line of its own and with status
    0, so that torchrun waits for rank 0 (a failed rank makes torchrun stop the others
    at once, and would name this rank as the cause)."""


@dataclass(frozen=True)
class World:
    """This process's place among the ranks of a run (one process: rank 0 of 1)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes the run directory and the report."""
        return self.rank == 0

    @property
    def split(self) -> bool:
        """More than one rank: the collectives below are live."""
        return self.size > 1


def world_from_env(environ: Mapping[str, str] | None = None) -> World:
    """The :class:`World` torchrun describes in ``environ`` (default: ``os.environ``);
    one process when none of its variables is set."""
    env = os.environ if environ is None else environ
    present = [key for key in ENV_KEYS if key in env]
    if not present:
        return World()
    if len(present) != len(ENV_KEYS):
        missing = [key for key in ENV_KEYS if key not in env]
        raise UsageError(
            f"torchrun sets {', '.join(ENV_KEYS)}; {', '.join(missing)} missing from the "
            "environment (launch with torchrun, or unset them to run one process)"
        )
    try:
        rank, size, local = (int(env[key]) for key in ENV_KEYS)
    except ValueError:
        shown = ", ".join(f"{key}={env[key]!r}" for key in ENV_KEYS)
        raise UsageError(f"torchrun environment is not integers: {shown}") from None
    if size < 1 or not 0 <= rank < size or local < 0:
        raise UsageError(f"torchrun environment out of range: RANK={rank} WORLD_SIZE={size}")
    return World(rank, size, local)


def backend_for(device: str) -> str:
    """``nccl`` for a CUDA policy device, ``gloo`` otherwise."""
    if device == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return "nccl" if device.startswith("cuda") else "gloo"


def init_world(device: str, world: World | None = None) -> World:
    """Join the run's process group (nothing to do for one process); on CUDA each rank
    takes the GPU ``LOCAL_RANK`` (so ``policy.device = "cuda"`` means that one)."""
    world = world_from_env() if world is None else world
    if not world.split or torch.distributed.is_initialized():
        return world
    backend = backend_for(device)
    if backend == "nccl":
        if ":" in device:
            raise UsageError(
                f"policy.device = {device!r} under torchrun: give 'cuda' or 'auto'; each "
                "rank takes the GPU numbered LOCAL_RANK"
            )
        torch.cuda.set_device(world.local_rank)
    timeout = float(os.environ.get("TURNRL_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    torch.distributed.init_process_group(
        backend, rank=world.rank, world_size=world.size, timeout=timedelta(seconds=timeout)
    )
    return world


def shutdown() -> None:
    """Leave the process group (after the last collective; safe when never joined)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def run_as_rank(world: World, device: str, work: Callable[[], None], *, command: str) -> NoReturn:
    """One rank's whole life under torchrun: join the group (``device`` picks the
    backend), ``work()``, leave the group, end the process (:func:`end_rank_process`)
    with its exit status: 0; :data:`EXIT_RANK_LOST` with one line on stderr
    (``"{command}: error: ..."``) when another rank stopped; 0 when rank 0 stopped the
    run and reports why itself (:class:`StoppedByRankZero`). Other errors propagate
    (the CLI reports them)."""
    end_rank_process(_rank_life(world, device, work, command=command))


def end_rank_process(status: int) -> NoReturn:
    """End a rank's process with ``status`` once its work is done and the group left:
    run the ``atexit`` handlers (Ray's shutdown where Ray was started) and flush the
    standard streams while the interpreter is whole, then ``os._exit``, skipping the
    interpreter's finalisation. Why: gloo's worker threads can still release tensors
    of finished collectives (FSDP2's among them) when the module objects that hold
    the process group are collected during finalisation; such a thread then takes
    the GIL of a finalising interpreter, which ends it with ``pthread_exit`` through
    C++ ``noexcept`` frames: ``terminate called without an active exception``,
    SIGABRT, exit status != 0 after a run that wrote everything. Everything a run
    writes is written atomically and closed before this point. The mechanism is the one pytorch PR
    179291 describes; here a rank of the 2-rank FSDP2 tests once ended so under heavy
    load (not reproduced in 36 loaded runs since), so this guards against a rare
    abort rather than a measured one."""
    import atexit
    import sys

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)


def _rank_life(world: World, device: str, work: Callable[[], None], *, command: str) -> int:
    """:func:`run_as_rank` up to the exit status."""
    import sys

    stop_on_sigterm(world)
    try:
        init_world(device, world)
        work()
        return 0
    except RankLost as error:
        ignore_sigterm()
        print(f"{command}: error: {error}", file=sys.stderr, flush=True)
        return EXIT_RANK_LOST
    except StoppedByRankZero:  # rank 0 prints why and exits with the run's status
        return 0
    finally:
        shutdown()


def stop_on_sigterm(world: World) -> None:
    """torchrun stops the other ranks with SIGTERM when one fails: raise :class:`RankLost`
    in the main thread then, so the run ends with one line instead of a traceback."""

    def handler(signum: int, frame: Any) -> None:
        ignore_sigterm()  # one line: a second SIGTERM while stopping changes nothing
        raise RankLost(
            f"rank {world.rank}: stopped by torchrun (another rank failed); nothing is "
            "half-written; continue with --resume from the last checkpoint"
        )

    signal.signal(signal.SIGTERM, handler)


def ignore_sigterm() -> None:
    """Ignore torchrun's SIGTERM from now on (a rank that already reported why it stops)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _collective(world: World, what: str, fn: Callable[[], T]) -> T:
    """Run one collective; a peer that went away becomes :class:`RankLost`."""
    try:
        return fn()
    except RuntimeError as error:  # DistBackendError and gloo's errors are RuntimeErrors
        reason = str(error).strip().splitlines()[0][:160] if str(error).strip() else "?"
        raise RankLost(
            f"rank {world.rank}: {what} failed: another rank stopped or the connection was "
            f"lost ({reason}); nothing is half-written; continue with --resume from the last "
            "checkpoint"
        ) from error


# --------------------------------------------------------------------------- work split


def owned_slice(count: int, world: World, *, what: str = "rollout.tasks_per_step") -> slice:
    """This rank's contiguous share of ``count`` items (a step's tasks): rank ``r`` of
    ``N`` owns items ``[r * count / N, (r + 1) * count / N)``. ``count`` must be a
    multiple of ``N``, so every rank has the same work and a task's group is never
    split (whole task trees per rank)."""
    if count % world.size:
        raise UsageError(
            f"{what} = {count} is not a multiple of the {world.size} torchrun ranks: "
            "each rank takes an equal share of whole tasks"
        )
    share = count // world.size
    return slice(world.rank * share, (world.rank + 1) * share)


# --------------------------------------------------------------------------- collectives


def sum_over_ranks(value: torch.Tensor, world: World) -> torch.Tensor:
    """``value`` summed over ranks (a copy; ``value`` itself is untouched)."""
    if not world.split:
        return value
    out = value.detach().clone()
    if torch.distributed.get_backend() == "nccl" and out.device.type != "cuda":
        out = out.cuda()
    _collective(world, "sum", lambda: torch.distributed.all_reduce(out))
    return out.to(value.device)


def reduce_gradients(parameters: Sequence[torch.nn.Parameter], world: World) -> None:
    """Sum every parameter's ``.grad`` over ranks, in place: one all-reduce per parameter
    dtype (one in all for a model in one precision).

    A rank without a gradient for a parameter (it ran no forward this step)
    contributes zeros; a parameter no rank has a gradient for stays ``None``. Whether
    a rank had one travels in the same buffer, as a trailing 0/1 per parameter
    (exact in any float format for up to 256 ranks).
    """
    if not world.split or not parameters:
        return
    by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
    for parameter in parameters:
        by_dtype.setdefault(parameter.dtype, []).append(parameter)
    for dtype, group in by_dtype.items():
        device = group[0].device
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in group]
        have = torch.tensor([p.grad is not None for p in group], dtype=dtype, device=device)
        flat = torch.cat([*(g.reshape(-1) for g in grads), have])
        _collective(world, "gradient sum", lambda flat=flat: torch.distributed.all_reduce(flat))
        offset = 0
        for p, g, count in zip(group, grads, flat[-len(group) :].tolist(), strict=True):
            n = p.numel()
            if count == 0:
                p.grad = None
            else:
                p.grad = g
                g.copy_(flat[offset : offset + n].view_as(g))
            offset += n


def gather_objects(value: Any, world: World) -> list[Any]:
    """Every rank's ``value`` (picklable, on CPU), in rank order, on every rank."""
    if not world.split:
        return [value]
    out: list[Any] = [None] * world.size
    _collective(world, "gather", lambda: torch.distributed.all_gather_object(out, value))
    return out


def broadcast_object(value: Any, world: World) -> Any:
    """Rank 0's ``value`` (picklable, on CPU) on every rank."""
    if not world.split:
        return value
    box = [value if world.main else None]
    _collective(world, "broadcast", lambda: torch.distributed.broadcast_object_list(box, src=0))
    return box[0]


def broadcast_tensors_(tensors: Iterable[torch.Tensor], world: World) -> None:
    """Overwrite ``tensors`` with rank 0's, in place (same order and shapes everywhere)."""
    if not world.split:
        return
    for tensor in tensors:
        _collective(world, "broadcast", lambda t=tensor: torch.distributed.broadcast(t, src=0))


def scatter_objects(values: Sequence[Any] | None, world: World) -> Any:
    """Rank 0's ``values[r]`` (picklable, on CPU) on rank ``r``; ``values`` is read on rank 0
    only (one per rank there; other ranks pass ``None``)."""
    if not world.split:
        assert values is not None and len(values) == 1
        return values[0]
    if world.main and (values is None or len(values) != world.size):
        raise ValueError(f"rank 0 scatters one value per rank ({world.size})")
    out: list[Any] = [None]
    given = list(values) if world.main and values is not None else None
    _collective(world, "scatter", lambda: torch.distributed.scatter_object_list(out, given, src=0))
    return out[0]


def share_start_state(
    world: World,
    models: Sequence[torch.nn.Module],
    optimizer: torch.optim.Optimizer,
    extra: Any,
) -> Any:
    """Rank 0's starting state on every rank, by broadcast (no shared filesystem): the
    tensors of ``models`` (the learner, and the frozen KL reference when there is one),
    the optimiser state, the global RNG states and ``extra`` (counters, sampler states);
    returns rank 0's ``extra``. Refuses models whose parameter names differ from rank 0's."""
    from turnrl.train.checkpoint import capture_rng_state, restore_rng_state

    if not world.split:
        return extra
    keys = [list(m.state_dict()) for m in models]
    if broadcast_object(keys, world) != keys:
        raise UsageError(
            f"rank {world.rank}: the model's parameters differ from rank 0's; every "
            "rank must build the same policy (same policy.model, warm_start.init_from)"
        )
    for model in models:
        broadcast_tensors_(model.state_dict().values(), world)
    state = {
        "optimizer": cpu_state(optimizer.state_dict()),
        "rng": capture_rng_state(),
        "extra": extra,
    }
    state = broadcast_object(state if world.main else None, world)
    if not world.main:
        optimizer.load_state_dict(state["optimizer"])
        restore_rng_state(state["rng"])
    return state["extra"]


def barrier(world: World) -> None:
    """Wait until every rank got here."""
    if world.split:
        _collective(world, "barrier", torch.distributed.barrier)


def on_main(fn: Callable[[], T], world: World) -> T | None:
    """Run ``fn`` on rank 0 only; a :class:`TurnrlError` it raises is raised on every rank
    (same type and message), so all ranks stop together with the same one line.
    Other ranks get ``None``."""
    result: T | None = None
    failure: tuple[type, str] | None = None
    if world.main:
        try:
            result = fn()
        except TurnrlError as error:
            failure = (type(error), str(error))
    failure = broadcast_object(failure, world)
    if failure is not None:
        kind, message = failure
        raise kind(message)
    return result


def all_agree(fn: Callable[[], Any], world: World) -> None:
    """Run ``fn`` on every rank; if it raised a :class:`TurnrlError` on any rank, raise the
    first such error (lowest rank) on every rank, so all stop together with one line
    (e.g. each rank's checks before rank 0 writes anything)."""
    failure: tuple[type, str] | None = None
    try:
        fn()
    except TurnrlError as error:
        failure = (type(error), str(error))
    failures = [f for f in gather_objects(failure, world) if f is not None]
    if failures:
        kind, message = failures[0]
        raise kind(message)


def cpu_state(state: Mapping[str, Any]) -> Any:
    """A (nested) state dict with every tensor copied to CPU, for object collectives."""
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()
    if isinstance(state, Mapping):
        return {k: cpu_state(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(cpu_state(v) for v in state)
    return state
