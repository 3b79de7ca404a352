"""Stand-ins for a vLLM server in the main suite (no vllm needed): the routes the
``vllm-server`` backend calls, answered in this process over real HTTP.

* :class:`JsonServer`: a threaded HTTP server whose subclasses answer JSON routes
  (``get`` / ``post`` return a status and a body), recording every call.
* :class:`TransformersVLLMServer`: a server that samples with a transformers copy of
  the tiny model, as vLLM's OpenAI-compatible server would with ``--logprobs-mode
  processed_logprobs``, ``--skip-tokenizer-init``, LoRA and the dev routes: it takes
  full weights (``/collective_rpc`` ``reload_weights``) and LoRA adapters
  (``/v1/load_lora_adapter``, merged into a copy of its base with peft), and records the
  version it held at every completion (the number in the pushed directory's name).
"""

from __future__ import annotations

import copy
import http.server
import json
import threading
from pathlib import Path
from typing import Any

NOT_FOUND = (404, {"detail": "Not Found"})


class JsonServer:
    """A threaded HTTP server on a free local port; ``calls`` lists every request."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, object]] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def reply(self, status: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                fake.calls.append(("GET", self.path, None))
                self.reply(*fake.get(self.path))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"null")
                fake.calls.append(("POST", self.path, body))
                self.reply(*fake.post(self.path, body))

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def get(self, path: str) -> tuple[int, object]:
        return NOT_FOUND

    def post(self, path: str, body: Any) -> tuple[int, object]:
        return NOT_FOUND

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def pushed_version(directory: str) -> int:
    """The version of a push from its directory (``.../v{version}``, or its ``base``)."""
    path = Path(directory)
    return int((path.parent if path.name == "base" else path).name.removeprefix("v"))


class TransformersVLLMServer(JsonServer):
    """A vLLM server that samples with ``policy`` (an ``HFPolicy`` of the tiny model;
    module docstring). ``held`` lists the version of the weights behind each completion,
    in the order they were answered; ``loads`` every push as ``(kind, version)``."""

    def __init__(self, policy: Any, name: str = "tiny") -> None:
        self.policy = policy
        self.name = name
        self.base = policy.model
        self.models: dict[str, tuple[Any, int]] = {name: (policy.model, -1)}
        """Each servable name (the base, loaded adapters): its model and version."""
        self.held: list[int] = []
        self.loads: list[tuple[str, int]] = []
        self.lock = threading.Lock()  # one sample at a time, as one engine step would
        super().__init__()

    def served_name(self) -> str:
        """The name that serves the newest weights (the last adapter, else the base)."""
        return max(self.models, key=lambda name: self.models[name][1])

    def get(self, path: str) -> tuple[int, object]:
        if path == "/v1/models":
            return 200, {"data": [{"id": self.name, "max_model_len": 4096}]}
        if path == "/is_paused":  # the dev routes are on
            return 200, {"is_paused": False}
        return NOT_FOUND

    def post(self, path: str, body: Any) -> tuple[int, object]:
        with self.lock:
            if path == "/v1/completions":
                return self._complete(body)
            if path == "/collective_rpc" and body["method"] == "reload_weights":
                self._reload(body["kwargs"]["weights_path"])
            elif path == "/v1/load_lora_adapter":
                self._load_adapter(body["lora_name"], body["lora_path"])
            elif path == "/v1/unload_lora_adapter":
                if self.models.pop(body["lora_name"], None) is None:  # as vLLM answers
                    return 404, {"error": {"message": f"{body['lora_name']} not loaded"}}
            elif path != "/reset_prefix_cache":
                return NOT_FOUND
            return 200, "ok"

    def _reload(self, directory: str) -> None:
        from safetensors.torch import load_file

        self.base.load_state_dict(load_file(str(Path(directory) / "model.safetensors")))
        version = pushed_version(directory)
        self.models[self.name] = (self.base, version)
        self.loads.append(("full", version))

    def _load_adapter(self, name: str, directory: str) -> None:
        from peft import PeftModel

        with_adapters = PeftModel.from_pretrained(copy.deepcopy(self.base), directory)
        version = pushed_version(directory)
        self.models[name] = (with_adapters.merge_and_unload().eval(), version)
        self.loads.append(("lora", version))

    def _complete(self, body: dict[str, Any]) -> tuple[int, object]:
        if body["model"] not in self.models:
            return NOT_FOUND
        model, version = self.models[body["model"]]
        served = self.policy.model
        self.policy.model = model
        try:
            [sample] = self.policy.sample(
                [body["prompt"]],
                max_new_tokens=body["max_tokens"],
                temperature=body["temperature"],
                seed=body.get("seed"),
            )
        finally:
            self.policy.model = served
        self.held.append(version)
        choice = {"token_ids": sample.response_ids, "logprobs": {"token_logprobs": sample.logprobs}}
        return 200, {"choices": [choice]}
