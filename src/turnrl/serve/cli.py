"""``turnrl serve``: run the gateway in the foreground until Ctrl-C.

Registered in the top-level CLI through :func:`add_serve_command`. Heavy
imports (torch, transformers, starlette, uvicorn) happen only when the command
runs, so ``turnrl --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from turnrl.serve.gateway import GatewayConfig


def load_policy(spec: str, *, seed: int = 0, device: str = "cpu") -> Any:
    """``"tiny"``: a fresh tiny random policy; else a local directory written by
    ``HFPolicy.save`` / ``save_pretrained`` (nothing is downloaded)."""
    from pathlib import Path

    from turnrl.policy import HFPolicy, build_tiny_policy

    if spec == "tiny":
        return build_tiny_policy(seed=seed)
    if not Path(spec).is_dir():
        raise ValueError(f"--policy {spec!r}: not a directory (or 'tiny')")
    return HFPolicy.from_pretrained(spec, device=device)


def cmd_serve(args: argparse.Namespace) -> int:
    """Load the policy and serve it until interrupted."""
    import uvicorn

    from turnrl.serve.gateway import Gateway
    from turnrl.serve.server import check_host, uvicorn_config

    check_host(args.host, args.allow_remote)
    config = GatewayConfig(
        model_name=args.model_name,
        tool_format=args.tool_format,
        tools_in_prompt=not args.no_tools_prompt,
        default_max_tokens=args.default_max_tokens,
        max_tokens_limit=args.max_tokens_limit,
        default_temperature=args.temperature,
        batch_window_s=args.batch_window_ms / 1000.0,
        max_batch=args.max_batch,
        records_path=args.records,
    )
    policy = load_policy(args.policy, seed=args.seed, device=args.device)
    with Gateway(policy, config) as gateway:
        server = uvicorn.Server(uvicorn_config(gateway, args.host, args.port, args.log_level))
        where = f"http://{args.host}:{args.port}"
        print(
            f"turnrl serve: {where}/rollouts/ROLLOUT_ID/v1 (OpenAI base_url); records -> "
            f"{args.records or 'memory only'}",
            file=sys.stderr,
        )
        server.run()
    return 0


def add_serve_command(subparsers: Any) -> None:
    """Register ``turnrl serve`` on the top-level CLI's subparsers."""
    defaults = GatewayConfig()
    p = subparsers.add_parser(
        "serve", help="OpenAI-compatible endpoint that records agent calls as turn records"
    )
    p.add_argument("--policy", default="tiny", help="policy directory, or 'tiny' (default)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback only by default)")
    p.add_argument("--port", type=int, default=8000)
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
    p.add_argument("--seed", type=int, default=0, help="weights seed of the tiny policy")
    p.add_argument("--device", default="cpu")
    p.add_argument("--log-level", default="info", help="uvicorn log level")
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a non-loopback --host (the gateway has no authentication)",
    )
    p.set_defaults(handler=cmd_serve)
