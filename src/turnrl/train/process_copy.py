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

What crosses: only token ids and samples. Tokenising, the chat layout and decoding stay
in this process (:class:`~turnrl.policy.chat.ChatEncoding` over the learner's
tokenizer), so a record's tokens are those the learner's own encoding gives. The child
reads one queue in order: ``weights`` (full weights, a LoRA learner's adapters merged,
copied once into shared memory: :func:`turnrl.train.async_sampler.shared_copy`),
``sample`` (contexts and the sampling arguments) and ``stop``. A ``sample`` call waits
for its answer; the gateway's policy lock already lets one call through at a time, and
a lock here keeps the copy safe for any caller. A push waits until the child has loaded
the weights, so every call after it samples with them.

The child is spawned (a fresh interpreter; it builds the model from ``policy``'s
settings, then loads the learner's weights, pushed right after it starts): the agent
loop's process runs threads (gateways, agents) whose locks a fork would copy held.
Failures: a child that died or raised is a :class:`ProcessCopyError`, one line naming
it; the child dies with its parent (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from turnrl.errors import TurnrlError
from turnrl.policy.chat import ChatEncoding, ChatFormat
from turnrl.train.async_sampler import POLL_S, parent_messages, shared_copy, stop_child
from turnrl.types import Sample

__all__ = ["ProcessCopy", "ProcessCopyError"]


class ProcessCopyError(TurnrlError, RuntimeError):
    """The served copy's process died or failed; the message names it."""


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
            if message[0] == "weights":
                policy.model.load_state_dict(message[1])
                outbox.put(("loaded",))
                continue
            _, contexts, options = message
            outbox.put(("sampled", policy.sample(contexts, **options)))
    except BaseException as err:  # said to the parent in one line
        outbox.put(("failed", f"{type(err).__name__}: {err}"))


class ProcessCopy(ChatEncoding):
    """A sampling policy whose weights live in a child process (module docstring).

    ``learner`` gives the tokenizer and chat layout; ``settings`` (the run's
    ``PolicyConfig``; LoRA is dropped: the child takes merged weights) and ``seed``
    build the child's model, whose weights :meth:`load_full_weights` then sets.
    """

    def __init__(self, learner: Any, settings: Any, seed: int) -> None:
        import dataclasses

        import torch.multiprocessing as mp

        self.tokenizer = learner.tokenizer
        self.chat = ChatFormat(learner.tokenizer, learner.end_of_turn)
        self.end_of_turn = self.chat.end_of_turn
        self.eos_token_id: int = self.chat.eos_token_id
        self.stop_token_ids = list(self.chat.stop_token_ids)
        self.max_context: int | None = learner.max_context
        self.policy_version: int | None = None
        """The version of the weights last loaded (None before the first push)."""
        self._lock = threading.Lock()
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
        returns once it has loaded them."""
        with self._lock:
            shared = shared_copy(state)
            self._inbox.put(("weights", shared))
            self._wait("loaded", "loading weights")
            del shared
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
        with self._lock:
            self._inbox.put(("sample", [list(c) for c in contexts], options))
            return self._wait("sampled", "sampling")

    def _wait(self, kind: str, doing: str) -> Any:
        while True:
            try:
                message = self._outbox.get(timeout=POLL_S)
            except queue.Empty:
                if not self._process.is_alive():
                    raise ProcessCopyError(
                        f"the served copy's process (pid {self.pid}) ended with exit code "
                        f"{self._process.exitcode} while {doing}; the run stopped (continue "
                        "it with --resume)"
                    ) from None
                continue
            if message[0] == "failed":
                raise ProcessCopyError(
                    f"the served copy's process (pid {self.pid}) failed while {doing}: "
                    f"{message[1]}; the run stopped"
                )
            assert message[0] == kind, f"served copy: expected {kind!r}, got {message[0]!r}"
            return message[1] if len(message) > 1 else None

    def close(self) -> None:
        """Stop the child and wait for it (killed if it does not leave in time)."""
        stop_child(self._process, self._inbox, self._outbox)
