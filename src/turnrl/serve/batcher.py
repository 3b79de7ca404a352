"""A micro-batcher: concurrent sampling requests share one ``policy.sample`` call.

Agent programs call the gateway one request at a time per rollout, but many
rollouts run at once. Sampling them one by one would waste the batched,
KV-cached sampler, so requests go through one worker thread that, after the
first request arrives, keeps gathering for up to ``window_s`` seconds (or until
``max_batch`` requests) and then samples each compatible group in one call.

Groups: requests with the same ``max_new_tokens`` and ``temperature`` and no
seed share a call. A request with a ``seed`` is sampled alone, because a
policy's seeded draws are only reproducible for the same batch
(``HFPolicy.sample``). The worker is the only thread that samples; it holds
``lock`` (shared with the gateway's tokenizer calls) while it does.

Choices. A request may ask for several samples of one context
(:meth:`MicroBatcher.submit_choices`, the gateway's ``n``): unseeded, they are rows of
their group's call; seeded, each choice is sampled alone with its own seed, exactly
as a single request with that seed would be. All choices of a request are drawn under
one hold of ``lock``, so from one set of weights. ``max_batch`` counts rows (choices).

Weights. :attr:`MicroBatcher.policy` and :attr:`MicroBatcher.version` change
only under ``lock`` (the gateway's weight swaps), and the worker reads both
under it, so every sample comes from one set of weights and says which
(:class:`Sampled`); a swap waits for the group being sampled.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from turnrl.types import Policy, Sample


@dataclass(frozen=True)
class Sampled:
    """One sample and the version of the weights that drew it."""

    sample: Sample
    policy_version: int


@dataclass
class _Job:
    context: list[int]
    max_new_tokens: int
    temperature: float
    seeds: tuple[int | None, ...]
    """One per choice: all ``None`` (unseeded), or every choice's own seed."""
    future: Future[list[Sampled]] = field(default_factory=Future)

    @property
    def seeded(self) -> bool:
        return any(seed is not None for seed in self.seeds)

    def group_key(self, unique: int) -> tuple[Any, ...]:
        """Jobs with equal keys are sampled together (seeded jobs never share)."""
        return (self.max_new_tokens, self.temperature, unique if self.seeded else None)


@dataclass
class BatcherStats:
    """Counters for monitoring how well requests are batched."""

    calls: int = 0
    """``policy.sample`` calls made."""
    requests: int = 0
    """Requests sampled."""
    largest: int = 0
    """Most requests sampled in one call."""


class MicroBatcher:
    """Samples submitted contexts in batches on one worker thread (see module doc)."""

    def __init__(
        self,
        policy: Policy,
        *,
        window_s: float = 0.005,
        max_batch: int = 64,
        lock: threading.RLock | None = None,
        version: int = 0,
    ) -> None:
        if window_s < 0 or max_batch < 1:
            raise ValueError(f"need window_s >= 0 and max_batch >= 1, got {window_s}, {max_batch}")
        self.policy = policy
        """The policy sampled from (replaced only under ``lock``)."""
        self.version = version
        """Version of the weights sampled from (changed only under ``lock``)."""
        self.window_s = window_s
        self.max_batch = max_batch
        self.lock = lock if lock is not None else threading.RLock()
        self.stats = BatcherStats()
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._closed = False
        self._closing = threading.Lock()
        self._unique = itertools.count()
        self._thread = threading.Thread(target=self._run, name="turnrl-serve-batcher", daemon=True)
        self._thread.start()

    def submit(
        self,
        context: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        seed: int | None = None,
    ) -> Sampled:
        """Sample one response for ``context``; blocks until its batch is done.

        Exceptions raised by ``policy.sample`` are re-raised here, in every
        request of the failed batch.
        """
        return self.submit_choices(
            context, seeds=(seed,), max_new_tokens=max_new_tokens, temperature=temperature
        )[0]

    def submit_choices(
        self,
        context: list[int],
        *,
        seeds: Sequence[int | None],
        max_new_tokens: int,
        temperature: float,
    ) -> list[Sampled]:
        """Sample ``len(seeds)`` responses for ``context``, one per seed (all ``None``:
        unseeded), from one set of weights; blocks until they are done."""
        if not seeds:
            raise ValueError("need at least one choice")
        if any(seed is None for seed in seeds) and any(seed is not None for seed in seeds):
            raise ValueError("seed every choice or none")
        job = _Job(list(context), max_new_tokens, temperature, tuple(seeds))
        with self._closing:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._queue.put(job)
        return job.future.result()

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the worker after the requests already queued; later submits raise."""
        with self._closing:
            if not self._closed:
                self._closed = True
                self._queue.put(None)
        self._thread.join(timeout)

    # ------------------------------------------------------------------ worker
    def _gather(self, first: _Job) -> tuple[list[_Job], bool]:
        """The first job plus whatever arrives within the window, up to ``max_batch`` rows
        (a job's choices are never split); and whether to stop."""
        jobs = [first]
        rows = len(first.seeds)
        deadline = time.monotonic() + self.window_s
        while rows < self.max_batch:
            try:
                job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            jobs.append(job)
            rows += len(job.seeds)
        return jobs, False

    def _groups(self, jobs: list[_Job]) -> Iterator[list[_Job]]:
        groups: dict[tuple[Any, ...], list[_Job]] = {}
        for job in jobs:
            groups.setdefault(job.group_key(next(self._unique)), []).append(job)
        yield from groups.values()

    def _draw(self, contexts: list[list[int]], head: _Job, seed: int | None) -> list[Sample]:
        return self.policy.sample(
            contexts,
            max_new_tokens=head.max_new_tokens,
            temperature=head.temperature,
            seed=seed,
        )

    def _sample(self, group: list[_Job]) -> None:
        """One group: one ``policy.sample`` call for its rows, or (a seeded job) one call
        per choice, each with that choice's seed."""
        head = group[0]
        rows = sum(len(job.seeds) for job in group)
        try:
            with self.lock:
                version = self.version
                if head.seeded:  # alone in its group
                    draws = [self._draw([head.context], head, seed) for seed in head.seeds]
                else:
                    draws = [self._draw([j.context for j in group for _ in j.seeds], head, None)]
            samples = [sample for draw in draws for sample in draw]
            if len(samples) != rows:
                raise RuntimeError(f"policy returned {len(samples)} samples for {rows}")
        except BaseException as exc:  # every waiting request must be released
            for job in group:
                job.future.set_exception(exc)
            return
        self.stats.calls += len(draws)
        self.stats.requests += len(group)
        self.stats.largest = max(self.stats.largest, len(group))
        drawn = iter(samples)
        for job in group:
            job.future.set_result([Sampled(next(drawn), version) for _ in job.seeds])

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            jobs, stop = self._gather(first)
            for group in self._groups(jobs):
                self._sample(group)
        self._fail_pending()

    def _fail_pending(self) -> None:
        """Release requests still queued when the worker stops (none in normal use:
        submits after ``close`` raise, and the sentinel is queued last)."""
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.future.set_exception(RuntimeError("the batcher is closed"))
