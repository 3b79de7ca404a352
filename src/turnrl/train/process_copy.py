"""``ProcessCopy``: a frozen transformers copy of the learner that samples in a process
of its own (the agent loop's served copy at ``train.max_staleness = 1`` with
``policy.backend = "hf"``, docs/async.md).

Why a process: the served copy used to sample in the gateway's thread, beside the
learner's update in the same interpreter. Torch releases the interpreter lock inside
its kernels, but the many small Python steps of sampling and of the update (the
decoding loop, the optimiser, the gateway's batching) take turns on it, so the two
never ran fully side by side. Here the copy's sampling runs in a child with its own
interpreter and one torch thread: the learner updates on its core while the child
samples on the other.

What crosses: token ids in, samples out. Encoding contexts (the chat layout) stays in
this process (:class:`~turnrl.policy.chat.ChatEncoding` over the learner's tokenizer),
so a record's tokens are those the learner's own encoding gives; the child's sampler
decodes each sample's text and applies the stop ids with the same tokenizer, built
from the same settings. The child reads one queue in order: ``weights`` (full weights,
a LoRA learner's adapters merged, in shared memory:
:func:`turnrl.train.async_sampler.shared_copy`), ``sample`` (contexts and the sampling
arguments) and ``stop``; every request carries an id its reply repeats. A ``sample``
call waits for its answer; the gateway's policy lock already lets one call through at
a time, and a lock here keeps the copy safe for any caller. A push waits until the
child has loaded the weights, so every call after it samples with them.

The child is spawned (a fresh interpreter; it builds the model from ``policy``'s
settings, then loads the learner's weights, pushed right after it starts): the agent
loop's process runs threads (gateways, agents) whose locks a fork would copy held. As
with any spawned process, a script that starts training must guard its entry point
(``if __name__ == "__main__":``); the ``turnrl`` command does. Failures: an error of one
request (a context too long) fails that call only, as it did in the gateway's thread;
a child that died or cannot go on is a :class:`ProcessCopyError`, one line naming it,
kept as :attr:`ProcessCopy.failure` and raised again by every later call without
waiting; the child dies with its parent (``PR_SET_PDEATHSIG``).

Why keep the failure: an agent's call that meets a dead copy fails inside the gateway,
where it becomes that agent's failure. The trainer reads :attr:`ProcessCopy.failure`
after each step's agents and stops the run with the copy's one line, rather than
training on a step of failed agents (and blaming them).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from turnrl.errors import TurnrlError
from turnrl.policy.chat import ChatEncoding, ChatFormat
from turnrl.train.async_sampler import (
    child_reply,
    parent_messages,
    quiet_peer_deaths,
    shared_copy,
    stop_child,
)
from turnrl.types import Sample

__all__ = ["ProcessCopy", "ProcessCopyError"]


class ProcessCopyError(TurnrlError, RuntimeError):
    """The served copy's process died or failed; the message names it."""


def _answer(policy: Any, message: tuple[Any, ...]) -> tuple[Any, ...]:
    """The child's reply to one request: ``(kind, request id, result)``. An error of
    this request alone (a context too long, out of memory) is ``("error", id, text)``:
    the parent raises it for that call, and the child goes on serving."""
    kind, request = message[0], message[1]
    try:
        if kind == "weights":
            policy.model.load_state_dict(message[2])
            return ("loaded", request, None)
        return ("sampled", request, policy.sample(message[2], **message[3]))
    except Exception as err:
        return ("error", request, f"{type(err).__name__}: {err}")


def _serve(settings: Any, seed: int, inbox: Any, outbox: Any, parent: int) -> None:
    """The child's loop (module docstring)."""
    from turnrl.policy.factory import build_policy
    from turnrl.train.process_tree import die_with_parent

    die_with_parent(parent)
    torch.set_num_threads(1)
    try:
        policy = build_policy(settings, seed)
        policy.model.eval()
        policy.model.requires_grad_(False)
        for message in parent_messages(inbox, parent):
            reply = _answer(policy, message)
            del message  # a pushed state's shared memory is freed once loaded
            outbox.put(reply)
    except BaseException as err:  # the child cannot go on: said to the parent in one line
        outbox.put(("failed", None, f"{type(err).__name__}: {err}"))


class ProcessCopy(ChatEncoding):
    """A sampling policy whose weights live in a child process (module docstring).

    ``learner`` gives the tokenizer and chat layout; ``settings`` (the run's
    ``PolicyConfig``; LoRA is dropped: the child takes merged weights) and ``seed``
    build the child's model, whose weights :meth:`load_full_weights` then sets.
    """

    def __init__(self, learner: Any, settings: Any, seed: int) -> None:
        import dataclasses

        import torch.multiprocessing as mp

        quiet_peer_deaths()
        self.tokenizer = learner.tokenizer
        self.chat = ChatFormat(learner.tokenizer, learner.end_of_turn)
        self.end_of_turn = self.chat.end_of_turn
        self.eos_token_id: int = self.chat.eos_token_id
        self.stop_token_ids = list(self.chat.stop_token_ids)
        self.max_context: int | None = learner.max_context
        self.policy_version: int | None = None
        """The version of the weights last loaded (None before the first push)."""
        self.failure: ProcessCopyError | None = None
        """Why the child cannot serve any more (it died or failed); None while it can."""
        self._lock = threading.Lock()
        self._requests = 0
        context = mp.get_context("spawn")
        self._inbox = context.Queue()
        self._outbox = context.Queue()
        plain = dataclasses.replace(settings, lora_rank=0)
        self._process = context.Process(
            target=_serve,
            args=(plain, seed, self._inbox, self._outbox, os.getpid()),
            name="turnrl-served-copy",
            daemon=True,
        )
        self._process.start()

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    def load_full_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Give the child ``state`` (full weights, transformers names) as ``version``;
        returns once it has loaded them. ``state`` already in shared memory (from
        :func:`~turnrl.train.async_sampler.shared_copy`, made before the gateway's hold)
        is sent as it is."""
        shared = state if all(t.is_shared() for t in state.values()) else shared_copy(state)
        with self._lock:
            self._wait(self._send("weights", shared), "loading weights")
            self.policy_version = version

    def sample(
        self,
        contexts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        seed: int | Sequence[int] | None = None,
    ) -> list[Sample]:
        """The child's samples of ``contexts`` (:meth:`turnrl.policy.hf.HFPolicy.sample`'s
        contract: the same weights and seed give the same samples)."""
        if self.policy_version is None:
            raise ProcessCopyError("the served copy was asked to sample before any weights")
        options = {"max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed}
        rows = [list(c) for c in contexts]
        with self._lock:
            return self._wait(self._send("sample", rows, options), "sampling")

    def _send(self, kind: str, *payload: Any) -> int:
        """Queue one request; its id (replies carry it, so a reply left over from a call
        that was interrupted is never taken for another's)."""
        self._requests += 1
        self._inbox.put((kind, self._requests, *payload))
        return self._requests

    def _wait(self, request: int, doing: str) -> Any:
        """The result of request ``request``, waiting for it (:attr:`failure` raised
        at once, and kept, when the child cannot serve)."""
        if self.failure is not None:
            raise self.failure

        def died() -> ProcessCopyError:
            self.failure = ProcessCopyError(
                f"the served copy's process (pid {self.pid}) ended with exit code "
                f"{self._process.exitcode} while {doing}; the run stopped (continue "
                "it with --resume)"
            )
            return self.failure

        while True:
            kind, answered, result = child_reply(self._process, self._outbox, died)
            if kind == "failed":
                self.failure = ProcessCopyError(
                    f"the served copy's process (pid {self.pid}) failed while {doing}: "
                    f"{result}; the run stopped (continue it with --resume)"
                )
                raise self.failure
            if answered != request:  # the reply to an interrupted call
                continue
            if kind == "error":
                raise ProcessCopyError(f"the served copy failed while {doing}: {result}")
            return result

    def close(self) -> None:
        """Stop the child and wait for it (killed if it does not leave in time)."""
        stop_child(self._process, self._inbox, self._outbox)
