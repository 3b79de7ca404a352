"""What an agent program is and gives back: the contract the runner relies on.

:class:`LLM` is how an agent reaches the policy for one rollout; an
:class:`AgentProgram` runs the agent once per rollout and returns an
:class:`AgentOutput`; :func:`reward_of` judges it (raised, timed out, no reward,
a non-finite or out-of-range reward are :class:`AgentFailed`, and the runner,
:mod:`turnrl.train.agent.runner`, drops those rollouts). :func:`load_callable`
loads a ``module:function`` or ``file.py:function`` option (the entrypoint, the
warm-start teacher). The two programs are in :mod:`~turnrl.train.agent.inprocess`
and :mod:`~turnrl.train.agent.command`; :func:`~turnrl.train.agent.programs.make_program`
picks one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from turnrl.entrypoints import load_object
from turnrl.errors import ConfigError
from turnrl.options import finite_real, is_real
from turnrl.rollout.success import SuccessFlagError, success_flag
from turnrl.train.update.credit_check import MAX_ABS_REWARD


class AgentConfigError(ConfigError):
    """The agent program cannot be loaded or started (caught before any work)."""


class AgentFailed(Exception):
    """One rollout's agent failed: ``reason`` is one line, ``details`` a traceback or output."""

    def __init__(self, reason: str, details: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.details = details


@dataclass(frozen=True)
class LLM:
    """How an agent function reaches the policy for one rollout of one task.

    ``base_url`` already names the rollout, so every chat completion made with it
    is a turn of this rollout; ``model`` may be replaced by any name, which becomes
    the turn's ``role`` (several agents in one program: ``"solver"``, ``"checker"``).
    """

    base_url: str
    """OpenAI ``base_url`` scoped to this rollout (``.../rollouts/ID/v1``)."""
    api_key: str
    """The run's gateway key (a fresh one per run): clients send it as ``Authorization:
    Bearer``; the gateway refuses calls without it."""
    model: str
    """The model name to ask for (the default role)."""
    rollout_id: str
    task_id: str
    timeout_s: float
    """The rollout's time limit (also a sensible per-request timeout)."""
    reward_url: str
    """Where to POST ``{"reward": x}`` instead of returning it (with the key:
    ``Authorization: Bearer`` ``api_key``); it carries this rollout's secret."""
    env: dict[str, str] = field(default_factory=dict, repr=False)
    """The gateway's environment variables for this rollout (``OPENAI_BASE_URL``,
    ``OPENAI_API_KEY`` and Agent Lightning's ``AGL_*``), handed to commands."""
    http_client: Any = field(default=None, repr=False, compare=False)
    """An ``httpx`` client shared by the batch's rollouts (``openai_client`` uses it: a new
    one costs about 0.1 s of CPU, mostly loading certificates), or None."""
    async_http_client: Any = field(default=None, repr=False, compare=False)
    """The same for ``async_openai_client`` (bound to the batch's event loop)."""

    def client_settings(self, **overrides: Any) -> dict[str, Any]:
        """Keyword arguments for an ``openai.OpenAI``/``AsyncOpenAI`` client of this rollout.

        The request timeout is the rollout's; retries are the client's default (the
        gateway answers a repeated request once, with the first call's result).
        """
        return {
            "base_url": self.base_url,
            "api_key": self.api_key,
            "timeout": self.timeout_s,
            **overrides,
        }

    def openai_client(self, **overrides: Any) -> Any:
        """An ``openai.OpenAI`` client for this rollout (needs the ``openai`` package)."""
        import openai

        if self.http_client is not None:
            overrides.setdefault("http_client", self.http_client)
        return openai.OpenAI(**self.client_settings(**overrides))

    def async_openai_client(self, **overrides: Any) -> Any:
        """An ``openai.AsyncOpenAI`` client for this rollout."""
        import openai

        if self.async_http_client is not None:
            overrides.setdefault("http_client", self.async_http_client)
        return openai.AsyncOpenAI(**self.client_settings(**overrides))


@dataclass
class AgentOutput:
    """What one agent run gave back, before it is judged (see :func:`reward_of`)."""

    value: Any = None
    """An entrypoint's return value, or the parsed last stdout line of a command."""
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    details: str = field(default="", repr=False)
    """What to save if the run turns out to have failed (output, or nothing)."""


class AgentProgram(Protocol):
    """One way of running the user's agent: once per rollout, for one task."""

    description: str

    async def run(self, task: dict[str, Any], llm: LLM, timeout_s: float) -> AgentOutput:
        """Run the agent to the end; :class:`AgentFailed` if it crashed or ran past
        ``timeout_s`` (nothing it started is left running, threads excepted)."""
        ...


def reward_of(output: AgentOutput, posted: float | None) -> tuple[float, dict[str, Any]]:
    """The rollout's reward and info, or :class:`AgentFailed` saying why there is none.

    ``posted`` is the reward the agent posted to the gateway itself (or ``None``).
    A posted reward has already finished the rollout, so it is the reward; a
    returned or printed one must then be the same number (a different one is a
    failure, never an override) and contributes its ``info``.
    """
    value = output.value
    info: dict[str, Any] = {}
    if isinstance(value, dict):
        raw_info = value.get("info", {})
        if not isinstance(raw_info, dict):
            raise AgentFailed(
                f"'info' must be a dict, got {type(raw_info).__name__}", output.details
            )
        info = raw_info
        try:
            success_flag(info.get("success"), "info.success")
        except SuccessFlagError as err:
            raise AgentFailed(str(err), output.details) from None
        if "reward" not in value and posted is None:
            raise AgentFailed("returned a dict without 'reward'", output.details)
        value = value.get("reward")
    if posted is not None:
        if value is not None and not (is_real(value) and float(value) == posted):
            raise AgentFailed(
                f"the agent posted reward {posted:g} and returned {value!r}; a rollout has "
                "one reward (post it or return it)",
                output.details,
            )
        return check_reward_range(posted, output.details), info
    if value is None:
        raise AgentFailed("no reward (nothing returned or printed, nothing posted)", output.details)
    if not is_real(value):
        raise AgentFailed(
            f"the reward must be a number (an int, a float or a NumPy scalar), got "
            f"{value!r} ({type(value).__name__})",
            output.details,
        )
    number = finite_real(value)
    if number is None:
        raise AgentFailed(f"the reward is not finite ({value!r})", output.details)
    return check_reward_range(number, output.details), info


def check_reward_range(reward: float, details: str = "") -> float:
    """``reward`` if ``|reward| <= MAX_ABS_REWARD``, else :class:`AgentFailed` saying so."""
    if not abs(reward) <= MAX_ABS_REWARD:
        raise AgentFailed(
            f"the reward {reward!r} is outside the accepted range |reward| <= "
            f"{MAX_ABS_REWARD:g} (larger values overflow the advantages)",
            details,
        )
    return reward


def load_entrypoint(spec: str) -> Callable[..., Any]:
    """The function an ``agent.entrypoint`` string names, checked to take ``(task, llm)``."""
    return load_callable(spec, "agent.entrypoint", arity=2)


def load_callable(spec: str, option: str, *, arity: int) -> Callable[..., Any]:
    """The function ``spec`` names, checked to accept ``arity`` positional arguments.

    ``"package.module:function"`` imports the module (the current directory is on
    the path); ``"path/to/file.py:function"`` loads that file. Raises
    :class:`AgentConfigError` naming ``option`` and what is wrong.
    """
    fn = load_object(spec, option, error=AgentConfigError)
    target, name = spec.strip().rsplit(":", 1)
    if not callable(fn):
        raise AgentConfigError(f"{option}: {target}:{name} is not callable")
    try:
        inspect.signature(fn).bind(*([object()] * arity))
    except TypeError as exc:
        what = "(task, llm)" if arity == 2 else f"{arity} positional arguments"
        raise AgentConfigError(f"{option}: {target}:{name} must accept {what}: {exc}") from None
    except ValueError:  # builtins without a signature: let the call decide
        pass
    return fn
