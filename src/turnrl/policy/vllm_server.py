"""``VLLMServerPolicy``: sample through a vLLM server the user already runs
(``policy.backend = "vllm-server"``, ``policy.server_url``).

Sampling only, as :class:`turnrl.policy.vllm.VLLMPolicy`: the learner stays in this
process; the server holds a copy of its weights and samples the rollouts. Nothing of
vLLM is imported here (the server is another program, maybe another venv), so this
backend works from the main venv too.

* **Tokens are the learner's.** Every context is sent as token ids (``prompt`` a list
  of ints) to vLLM's OpenAI-compatible ``POST /v1/completions``, one request per row
  (each with its own seed; the server batches concurrent requests). The answer's
  ``token_ids`` (``return_token_ids``) and ``logprobs.token_logprobs`` (``logprobs:
  0``, ``return_tokens_as_token_ids``) are the sample; they are parsed and checked,
  never evaluated, and a malformed answer is a :class:`SamplerServerError` naming the
  field. Rows stop at the learner's end-of-turn/eos ids (``stop_token_ids``), kept in
  the response as on the other backends.
* **Log-probs after temperature** need the server started with ``--logprobs-mode
  processed_logprobs`` (vLLM returns raw log-probs otherwise); where the server shows
  its config (``GET /server_info``, dev mode) a different mode is refused at start.
  A tiny temperature (below 0.01, which the server would raise to 0.01) is sent as 0
  and its tokens recorded with log-prob 0, as on the in-process engine
  (:func:`turnrl.policy.vllm.engine_temperature`).
* **Weights after each update** (:meth:`load_learner`, called by
  :func:`turnrl.policy.sync.push_weights`) go through a directory both sides can
  read (``weights_dir``, a temporary one by default: the server must run on this
  machine or share the file system):

  - a LoRA learner: its adapters are saved there and loaded as a new adapter
    ``turnrl-v{version}`` (``POST /v1/load_lora_adapter``; the server needs
    ``--enable-lora``, ``--max-lora-rank >= policy.lora_rank`` and
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``); requests then name it as their model
    and the previous version's adapter is unloaded. A new name per version means no
    cached prefix of the old adapter is reused;
  - full weights: saved there (safetensors) and reloaded in place by the server's
    workers (``POST /collective_rpc`` with ``reload_weights(weights_path=...)``, then
    ``POST /reset_prefix_cache``); these routes exist only in vLLM's dev mode
    (``VLLM_SERVER_DEV_MODE=1``). vLLM 0.32's other weight routes
    (``/init_weight_transfer_engine``, ``/update_weights``) move tensors over NCCL or
    CUDA IPC and need a GPU on both sides; not used.

  A server without the route a push needs answers 404; that is a
  :class:`SamplerServerError` saying how to start the server instead.

Every HTTP call has a timeout (``timeout_s``); an unreachable server, an HTTP error or
a timeout is a :class:`SamplerServerError` naming the URL.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from turnrl.errors import SamplerServerError
from turnrl.policy import lora
from turnrl.policy.chat import ChatEncoding, ChatFormat
from turnrl.policy.hf import transformers_progress_off
from turnrl.policy.vllm import (
    engine_sample,
    engine_temperature,
    request_seeds,
    response_budget,
    tiny_temperature_logprobs,
)
from turnrl.types import Sample

__all__ = ["VLLMServerPolicy", "call_server", "check_server_reachable", "parse_completion"]

TIMEOUT_S = 600.0
"""Default seconds one HTTP call may take (a batch of long samples on a slow server)."""

REACHABLE_TIMEOUT_S = 10.0
"""Seconds the start-up check waits for ``GET /v1/models`` (the server is idle then)."""

ADAPTER_PREFIX = "turnrl-v"
"""LoRA adapters are loaded as ``turnrl-v{version}``."""

MAX_PARALLEL = 64
"""Requests in flight at once (one per row): the server batches them."""


def parse_completion(body: Any, where: str) -> tuple[list[int], list[float]]:
    """The sampled ids and their log-probs from a ``/v1/completions`` answer for one
    prompt; a :class:`SamplerServerError` naming ``where`` and the field otherwise."""

    def bad(field: str, problem: str) -> SamplerServerError:
        return SamplerServerError(f"{where}: field {field!r}: {problem}")

    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise bad("choices", "expected a list of one completion")
    choice = choices[0]
    ids = choice.get("token_ids")
    if not isinstance(ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids
    ):
        raise bad("choices[0].token_ids", "expected a list of token ids (return_token_ids)")
    logprobs = choice.get("logprobs")
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(values, list) or len(values) != len(ids):
        raise bad(
            "choices[0].logprobs.token_logprobs",
            f"expected one log-prob per sampled token ({len(ids)})",
        )
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise bad("choices[0].logprobs.token_logprobs", "expected numbers")
    return ids, [float(v) for v in values]


def call_server(
    url: str,
    method: str,
    path: str,
    body: Any = None,
    *,
    api_key: str | None = None,
    timeout_s: float = TIMEOUT_S,
) -> Any:
    """One HTTP call to the server at ``url``; the decoded JSON answer (``None`` for an
    empty one, the text for one that is not JSON). A :class:`SamplerServerError` naming
    the URL when there is no answer or an HTTP error."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    where = f"{method} {url}{path}"
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            text = answer.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", errors="replace")[:300]
        raise SamplerServerError(f"{where}: HTTP {exc.code}: {detail}", status=exc.code) from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SamplerServerError(f"{where}: no answer ({reason})") from None
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # some vLLM routes answer plain text (load_lora_adapter)


def check_server_reachable(
    url: str, *, field: str = "policy.server_url", timeout_s: float = REACHABLE_TIMEOUT_S
) -> None:
    """Refuse, before any work (a warm start), a server URL where nothing answers
    ``GET /v1/models``: one :class:`SamplerServerError` naming ``field``, the URL and how
    to start the server, instead of a failure after the warm start. An HTTP error is an
    answer (the client names it when it starts)."""
    root = url.rstrip("/").removesuffix("/v1")
    try:
        call_server(root, "GET", "/v1/models", timeout_s=timeout_s)
    except SamplerServerError as err:
        if err.status is not None:  # it answered (an HTTP error is for the client to say)
            return
        raise SamplerServerError(
            f"{field} = {url!r}: {err}; start the vLLM server first (docs/backends.md), "
            "or give another URL",
        ) from None


def save_full_weights(model: Any, directory: Path) -> None:
    """``model``'s config and every weight under its transformers names in one
    safetensors file. Tied weights are written under each name (``save_pretrained``
    drops the tied ``lm_head.weight``, which vLLM's in-place reload then leaves stale)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(directory))
    weights = {
        name: tensor.detach().cpu().contiguous().clone()
        for name, tensor in model.state_dict().items()
    }
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})


class VLLMServerPolicy(ChatEncoding):
    """A sampling policy on a running vLLM server, with the learner's chat layout.

    ``url`` is the server's root (``http://HOST:PORT``; a trailing ``/v1`` is
    accepted). ``model`` is the name requests use (default: the first model the server
    lists). ``policy_version`` is the version of the weights last pushed (0 at start).
    """

    def __init__(
        self,
        url: str,
        tokenizer: Any,
        *,
        end_of_turn: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = TIMEOUT_S,
        weights_dir: str | Path | None = None,
    ) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.tokenizer = tokenizer
        self.chat = ChatFormat(tokenizer, end_of_turn)
        self.end_of_turn = self.chat.end_of_turn
        self.eos_token_id: int = self.chat.eos_token_id
        self.stop_token_ids = list(self.chat.stop_token_ids)
        listed = self._models()
        self.base_model = model if model is not None else str(listed[0]["id"])
        self.served_model = self.base_model
        """The model name requests use: the base model, or the latest LoRA adapter."""
        limit = next(
            (m.get("max_model_len") for m in listed if m.get("id") == self.base_model), None
        )
        self.max_context: int | None = int(limit) if isinstance(limit, int) else None
        self.policy_version = 0
        self._base_pushed = False
        self._own_weights_dir = weights_dir is None
        self.weights_dir = Path(
            tempfile.mkdtemp(prefix="turnrl-vllm-server-") if weights_dir is None else weights_dir
        )
        self._check_logprobs_mode()

    @classmethod
    def from_policy(cls, learner: Any, url: str, **options: Any) -> VLLMServerPolicy:
        """A client of the server at ``url`` for ``learner``'s tokenizer and chat layout.
        The server must already serve the learner's weights (the trainer pushes them
        right after building the sampler)."""
        return cls(url, learner.tokenizer, end_of_turn=learner.end_of_turn, **options)

    # --------------------------------------------------------------------- HTTP
    def _call(self, method: str, path: str, body: Any = None) -> Any:
        """One HTTP call; the decoded JSON answer (``None`` for an empty one)."""
        return call_server(
            self.url, method, path, body, api_key=self.api_key, timeout_s=self.timeout_s
        )

    def _models(self) -> list[dict[str, Any]]:
        body = self._call("GET", "/v1/models")
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or not data or not all(isinstance(m, dict) for m in data):
            raise SamplerServerError(f"GET {self.url}/v1/models: field 'data': no model listed")
        return data

    def _check_logprobs_mode(self) -> None:
        """Refuse a server whose log-probs are not after temperature, where it says
        (``GET /server_info?config_format=json``, dev mode only)."""
        try:
            info = self._call("GET", "/server_info?config_format=json")
        except SamplerServerError as exc:
            if exc.status == 404:  # not in dev mode: it does not say
                return
            raise
        config = info.get("vllm_config") if isinstance(info, dict) else None
        model = config.get("model_config") if isinstance(config, dict) else None
        mode = model.get("logprobs_mode") if isinstance(model, dict) else None
        if mode is not None and mode != "processed_logprobs":
            raise SamplerServerError(
                f"{self.url}: the server's log-probs are {mode!r}, not after temperature; "
                "start it with --logprobs-mode processed_logprobs"
            )

    # ------------------------------------------------------------------ weights
    def load_learner(self, learner: Any, version: int) -> None:
        """Give the server ``learner``'s current weights as ``version`` (adapters for a
        LoRA learner, full weights otherwise; see the module docstring). A LoRA
        learner's first push also reloads the base weights where the server has the
        dev routes, so base + adapters are exactly the learner's."""
        target = self.weights_dir / f"v{version}"
        shutil.rmtree(target, ignore_errors=True)
        model = learner.model
        if lora.is_adapter_model(model):
            if not self._base_pushed and self._has_dev_routes():
                save_full_weights(lora.base_copy(model), target / "base")
                self._reload_full(target / "base")
            self._base_pushed = True
            with transformers_progress_off():
                model.save_pretrained(str(target))  # the adapters only
            self._load_adapter(target, version)
        else:
            save_full_weights(model, target)
            self._reload_full(target)
        for old in self.weights_dir.glob("v*"):
            if old != target:
                shutil.rmtree(old, ignore_errors=True)
        self.policy_version = version

    def follow_learner(self, learner: Any, version: int) -> None:
        """Take ``version`` as pushed by another client of the same server (rank 0
        under torchrun ranks, which alone pushes: :meth:`load_learner` from every rank
        would reload the weights under the others' requests and unload an adapter twice):
        sample from what that push serves, without pushing."""
        if lora.is_adapter_model(learner.model):
            self._base_pushed = True
            self.served_model = f"{ADAPTER_PREFIX}{version}"
        self.policy_version = version

    def _has_dev_routes(self) -> bool:
        """Whether the server runs with ``VLLM_SERVER_DEV_MODE=1`` (its ``/is_paused``)."""
        try:
            self._call("GET", "/is_paused")
        except SamplerServerError as exc:
            if exc.status in (404, 405):
                return False
            raise
        return True

    def _load_adapter(self, directory: Path, version: int) -> None:
        name = f"{ADAPTER_PREFIX}{version}"
        body = {"lora_name": name, "lora_path": str(directory), "load_inplace": True}
        self._weights_route("POST", "/v1/load_lora_adapter", body, "LoRA adapters")
        previous = self.served_model
        self.served_model = name
        if previous.startswith(ADAPTER_PREFIX) and previous != name:
            self._call("POST", "/v1/unload_lora_adapter", {"lora_name": previous})

    def _reload_full(self, directory: Path) -> None:
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(directory)}}
        self._weights_route("POST", "/collective_rpc", body, "full weights")
        self._call("POST", "/reset_prefix_cache")  # cached states belong to the old weights

    def _weights_route(self, method: str, path: str, body: Any, what: str) -> None:
        try:
            self._call(method, path, body)
        except SamplerServerError as exc:
            if exc.status not in (404, 405):
                raise
            how = (
                "start it with --enable-lora --max-lora-rank R (>= policy.lora_rank) and "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
                if what == "LoRA adapters"
                else "start it with VLLM_SERVER_DEV_MODE=1 (vLLM's dev routes) or train LoRA "
                "adapters (policy.lora_rank > 0) with --enable-lora"
            )
            raise SamplerServerError(
                f"{self.url}: the server takes no {what} ({method} {path}: HTTP {exc.status}); "
                + how
            ) from None

    # ----------------------------------------------------------------- sampling
    def sample(
        self,
        contexts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        seed: int | Sequence[int] | None = None,
    ) -> list[Sample]:
        """One response per context (the other backends' contract), one request per row,
        sent concurrently."""
        seeds = request_seeds(contexts, max_new_tokens, temperature, seed, self.max_context)
        if not contexts:
            return []
        bodies = [
            self._request(context, response_budget(context, max_new_tokens, self.max_context),
                          temperature, row_seed)
            for context, row_seed in zip(contexts, seeds, strict=True)
        ]  # fmt: skip
        with ThreadPoolExecutor(max_workers=min(len(bodies), MAX_PARALLEL)) as pool:
            answers = list(pool.map(self._complete, bodies))
        return [
            engine_sample(
                ids, tiny_temperature_logprobs(logps, temperature), self.stop_token_ids, self.decode
            )
            for ids, logps in answers
        ]

    def _request(
        self, context: list[int], max_tokens: int, temperature: float, seed: int | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.served_model,
            "prompt": [int(t) for t in context],
            "max_tokens": max_tokens,
            "temperature": engine_temperature(temperature),
            "n": 1,
            "logprobs": 0,
            "stop_token_ids": self.stop_token_ids,
            "skip_special_tokens": False,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        if seed is not None:
            body["seed"] = seed
        return body

    def _complete(self, body: dict[str, Any]) -> tuple[list[int], list[float]]:
        answer = self._call("POST", "/v1/completions", body)
        return parse_completion(answer, f"POST {self.url}/v1/completions")

    def close(self) -> None:
        """Remove the weights directory this client made (the server keeps running: it
        is the user's)."""
        if self._own_weights_dir:
            shutil.rmtree(self.weights_dir, ignore_errors=True)
