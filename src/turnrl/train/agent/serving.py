"""The policy served to agent programs: a gateway over it at one temperature, its HTTP
server and the runner of agents against it, as the agent loop (training, evaluation,
the warm start's teacher) and ``turnrl eval`` with ``[agent]`` build them."""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from typing import Any

from turnrl.serve import Gateway, GatewayConfig, GatewayServer
from turnrl.train.agent.command import KILL_GRACE_S
from turnrl.train.agent.contract import AgentProgram
from turnrl.train.agent.runner import AgentRunner, GatewayLink

HOST = "127.0.0.1"
"""Agents reach the in-process gateway on the loopback interface only."""


@dataclass(frozen=True)
class ServedAgents:
    """One gateway serving the policy and the runner of agents against it."""

    gateway: Gateway
    runner: AgentRunner


def gateway_config(config: Any, temperature: float) -> GatewayConfig:
    """The gateway settings of a ``RunConfig`` with ``[agent]``, sampling at
    ``temperature`` unless a call asks for another."""
    agent = config.agent
    return GatewayConfig(
        tool_format=agent.tool_format,
        tools_in_prompt=agent.tools_in_prompt,
        default_max_tokens=config.policy.max_new_tokens,
        default_temperature=temperature,
        batch_window_s=agent.batch_window_ms / 1000,
        max_batch=agent.max_batch,
        # A safety net behind the runner's own timeout, which decides.
        rollout_timeout_s=agent.timeout_s + 2 * KILL_GRACE_S + 10,
        max_context_tokens=config.rollout.max_context_tokens or None,
        auto_open=False,  # only rollouts the caller opened are served
    )


def agent_runner(
    program: AgentProgram, config: Any, gateway: Gateway, server: GatewayServer
) -> AgentRunner:
    """The runner of ``program`` against ``gateway`` (served by ``server``), with the
    ``[agent]`` section's concurrency, timeout, model name and turn cost."""
    agent = config.agent
    return AgentRunner(
        program,
        GatewayLink(gateway, server),
        concurrency=agent.concurrency,
        timeout_s=agent.timeout_s,
        model=agent.model,
        turn_cost=agent.turn_cost,
    )


def serve_agents(
    servers: contextlib.ExitStack,
    sampler: Any,
    program: AgentProgram,
    config: Any,
    *,
    temperature: float,
    sock: socket.socket,
    version: int,
) -> ServedAgents:
    """A gateway over ``sampler`` at ``temperature`` (weights stamped ``version``), its
    server on ``sock`` and the runner of ``program`` against it; ``servers`` stops them."""
    gateway = servers.enter_context(
        Gateway(sampler, gateway_config(config, temperature), policy_version=version)
    )
    server = servers.enter_context(GatewayServer(gateway, sock=sock, list_rollouts=False))
    return ServedAgents(gateway, agent_runner(program, config, gateway, server))
