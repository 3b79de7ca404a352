"""The whole contract between turnrl's layers, in one small module.

Frozen dataclasses for data, ``Protocol``s for what other layers consume (and for an
environment's optional capabilities), and one ABC (``Env``) for what users subclass.
Nothing here imports torch, so every layer (including ``credit``, ``envs`` and the
integrations) can depend on it.

Conventions:

* A chat message is a plain ``dict`` with ``"role"`` and ``"content"`` (OpenAI chat
  format), so logs written by turnrl and by other frameworks look the same.
* Token ids are plain ``list[int]``; log-probs are ``list[float]`` aligned with the
  response ids (one per sampled token). A :class:`TurnRecord` holds them as tuples
  (it is frozen: nobody downstream can change what was sampled).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from turnrl.errors import CapabilityError

Message = dict[str, str]
"""One chat message: ``{"role": "system"|"user"|"assistant"|"tool", "content": str}``."""


@dataclass(frozen=True)
class Task:
    """One problem instance an episode starts from.

    ``task_id`` is the grouping key of the credit library (the "question"); two
    rollouts of the same ``Task`` share it. ``payload`` is whatever the environment
    needs to rebuild the instance (numbers of a problem, a map and its seed...).
    ``tags`` label the task for reporting (e.g. ``("hard",)``).
    """

    task_id: str
    payload: dict[str, Any]
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepResult:
    """What ``Env.step`` returns after one agent response.

    ``observation`` is the message appended to the context for the next turn
    (a tool result or the counterpart's reply), or ``None`` once ``done``.
    ``info`` carries per-turn facts for metrics and credit: ``tool_call`` (bool),
    ``malformed`` (bool, with ``error``), ``state_key`` (str, for GiGPO groups),
    ``correct`` (bool, on the final turn) and anything environment-specific.
    """

    observation: Message | None
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class Env(ABC):
    """A multi-turn environment: the agent's whole turn response is one action.

    Subclass this and write ``reset`` and ``step``; that is all every rollout needs.
    What only some algorithms need is an optional capability, a small protocol below
    that an environment has by defining its methods (no registration, no base class):
    :class:`Snapshots` (tree rollouts), :class:`StateKeys` (GiGPO's anchor states),
    :class:`References` (information gain), :class:`ResponseChecks` (Iterative GRPO's
    malformed candidates) and :class:`Truncation` (responses cut at the token limit).
    Code that needs one asks for it with :func:`require`, which names the missing
    capability in its error; code that can do without one falls back to what an
    environment without it means (no state key, every response well formed, a cut
    response stepped like any other).
    """

    @abstractmethod
    def reset(self, task: Task) -> list[Message]:
        """Start an episode; return the initial context (system + user messages)."""

    @abstractmethod
    def step(self, response: str) -> StepResult:
        """Apply the agent's response text and return what happened."""


# ------------------------------------------------------------ optional environment capabilities


@runtime_checkable
class Snapshots(Protocol):
    """Saves and restores its state, so tree rollouts (PATR, RTPO, AT-GRPO) can branch
    several responses from one saved state. The pair must round-trip exactly."""

    def snapshot(self) -> Any:
        """Return an opaque, independent copy of the current state."""
        ...

    def restore(self, snapshot: Any) -> None:
        """Return to a state produced by ``snapshot`` (the snapshot stays reusable)."""
        ...


@runtime_checkable
class StateKeys(Protocol):
    """Names its current state: GiGPO's anchor states (the ``state`` group key) and
    PATR's scorer. Without it a turn's ``state_key`` is null."""

    def state_key(self) -> str | None:
        """An id of the current environment state, if any."""
        ...


@runtime_checkable
class References(Protocol):
    """Knows the ideal final response to a task: information gain (A2TGPO, IGPO) is how
    much each turn raises the policy's log-probability of it."""

    def reference_response(self, task: Task) -> str | None:
        """The ideal final response to ``task`` (``None``: none for this task)."""
        ...


@runtime_checkable
class ResponseChecks(Protocol):
    """Checks a response's action syntax without an episode, so code that must not talk
    to the environment (Iterative GRPO's improvement step) can still reject malformed
    candidates. Without it every response counts as well formed."""

    def check_response(self, task: Task, response: str) -> str | None:
        """Why ``response`` is not a well-formed action for ``task`` (``None``: it is);
        a pure check that starts no episode and touches no state."""
        ...


@runtime_checkable
class Truncation(Protocol):
    """Treats a response cut at the token limit (it never ended on its own) its own way,
    e.g. ends the episode with no success reward (the calculator's
    ``truncation="zero_reward"``, verl's ``max_response_length``). Without it the
    runner steps the cut text like any response."""

    def step_truncated(self, response: str) -> StepResult:
        """Apply a response that sampling stopped at ``max_new_tokens``."""
        ...


CAPABILITIES: dict[type, str] = {
    Snapshots: "snapshots (snapshot() and restore(snapshot))",
    StateKeys: "state keys (state_key())",
    References: "reference responses (reference_response(task))",
    ResponseChecks: "response checks (check_response(task, response))",
    Truncation: "truncation handling (step_truncated(response))",
}
"""Each optional capability and how an error names it."""

C = TypeVar("C")


def require(env: Any, capability: type[C], purpose: str) -> C:
    """``env`` as a ``capability``, or :class:`~turnrl.errors.CapabilityError` saying that
    ``purpose`` needs it and which methods ``env``'s class lacks."""
    if isinstance(env, capability):
        return env
    raise CapabilityError(
        f"{purpose} needs an environment with {CAPABILITIES.get(capability, capability.__name__)}"
        f"; {type(env).__name__} has none"
    )


def state_key_of(env: Any) -> str | None:
    """``env.state_key()``, or ``None`` for an environment without :class:`StateKeys`."""
    return env.state_key() if isinstance(env, StateKeys) else None


@dataclass(frozen=True)
class Sample:
    """One sampled response for one context."""

    response_ids: list[int]
    logprobs: list[float]
    """Behaviour log-prob of each response token, under the sampling distribution."""
    stop_reason: str
    """``"stop"`` (the end-of-turn token was produced, and is included in
    ``response_ids``) or ``"length"`` (truncated at ``max_new_tokens``)."""
    text: str
    """The decoded response, without the end-of-turn token."""


@runtime_checkable
class Policy(Protocol):
    """What rollouts and trainers need from a policy.

    Contexts grow by appending token ids turn by turn: the runner calls
    ``encode_initial`` once, then after each response appends the response ids and
    ``encode_observation(message)``. Nothing is ever re-rendered from text, so the
    tokens a sample was drawn from are exactly the tokens trained on.
    """

    eos_token_id: int
    """The end-of-turn token id: the last id of a response that stopped normally."""

    max_context: int | None
    """Most positions (context plus response) the model accepts, if known."""

    def encode_initial(self, messages: list[Message]) -> list[int]:
        """Token ids of the initial messages plus the assistant generation prompt."""
        ...

    def encode_observation(self, message: Message) -> list[int]:
        """Token ids to append after a finished response: the message, then the
        generation prompt of the next assistant turn."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of response ids (end-of-turn token dropped)."""
        ...

    def sample(
        self,
        contexts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        seed: int | Sequence[int] | None = None,
    ) -> list[Sample]:
        """Sample one response per context, all contexts in one batch.

        ``seed`` is one seed for the batch, or one per context (each row then
        draws from its own generator, so its samples do not depend on the batch).
        """
        ...


@dataclass(frozen=True, slots=True)
class AglData:
    """What an Agent Lightning triplet carried that a turn record has no field for.

    Kept so that ``records_to_rollout`` gives the rollout back unchanged (JSON keys
    ``agl_reward``, ``agl_final_reward``, ``agl_response_id``, ``agl_task``,
    ``agl_metadata``; see :mod:`turnrl.integrations.agentlightning`). ``None`` is a
    real value for the two rewards (a triplet without a reward): both are always
    written; the other three only when set.
    """

    reward: float | None = None
    """The triplet's own reward (``agl_reward``)."""
    final_reward: float | None = None
    """The rollout's ``final_reward`` (``agl_final_reward``), on every turn."""
    response_id: str | None = None
    """The LLM response id of the triplet's metadata (``agl_response_id``)."""
    task: Mapping[str, Any] | None = None
    """The rollout's task, as a JSON object (``agl_task``)."""
    metadata: Mapping[str, Any] | None = None
    """The rollout's metadata (``agl_metadata``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRecord:
    """One agent turn: the interchange format of ``docs/turn-records.md``, typed.

    Rollouts, the gateway, chat-log imports and adapters produce these; credit,
    the trainers and the logs consume them. Frozen: a step's consumers (credit,
    the update, the rollout log) all see the record the producer wrote; results
    computed from it (advantages, returns) travel as arrays beside the
    ``TurnTable`` and are added to a log line only when it is written
    (``turnrl.records.dumps_record(record, advantage=...)``).

    In JSON every field has the key of its name, except :attr:`agl` (three
    ``agl_*`` keys) and :attr:`extra` (its own keys, at the top level). Optional
    fields that are ``None`` (``train`` when true, ``pruned`` when false) are left
    out of the line. Read and validate with ``turnrl.records.parse_record``.
    """

    # ---- the turn record's fields (docs/architecture.md, docs/turn-records.md)
    task_id: str
    """The question / episode seed the rollout started from."""
    traj_id: str
    """One rollout; belongs to exactly one task."""
    turn: int
    """Position of this turn in its trajectory (0, 1, ... without gaps)."""
    role: str = "agent"
    """Which agent produced the response."""
    prompt: str | tuple[Mapping[str, Any], ...] | None = None
    """The exact context the policy saw: text, or chat messages."""
    response: str | None = None
    """What the policy produced (text)."""
    prompt_ids: tuple[int, ...] | None = None
    """Exact context tokens (preferred over ``prompt`` for the default node id)."""
    response_ids: tuple[int, ...] | None = None
    """Exact response tokens."""
    logprobs: tuple[float, ...] | None = None
    """Behaviour log-prob of each response token (same length as ``response_ids``)."""
    reward: float = 0.0
    """Immediate reward received after this turn."""
    done: bool = False
    """The episode ended after this turn."""
    state_key: str | None = None
    """Environment state id (GiGPO ``state`` groups)."""
    node_id: str | None = None
    """Decision point; ``None``: a hash of ``task_id`` and the exact context."""
    info_gain: float | None = None
    """Information gain of this turn (A2TGPO, IGPO)."""
    q: float | None = None
    """Learned Q score of this response (Iterative GRPO)."""

    # ---- rollouts (the runner, the gateway, Ray workers)
    tags: tuple[str, ...] | None = None
    """The task's tags (for reporting)."""
    tool_call: bool | None = None
    """The response called a tool."""
    malformed: bool | None = None
    """The environment could not parse the response."""
    stop_reason: str | None = None
    """``"stop"`` (end-of-turn token sampled), ``"length"`` (cut at the token limit) or
    ``"stop_sequence"`` (the gateway: a request's stop string completed at the last token)."""
    finish_reason: str | None = None
    """The OpenAI ``finish_reason`` the gateway returned (``stop``, ``length``, ``tool_calls``)."""
    context_rebuilt: bool | None = None
    """The gateway re-rendered the context instead of extending the previous one."""
    temperature: float | None = None
    """Sampling temperature of the response (gateway, Iterative GRPO deployment)."""
    policy_version: int | None = None
    """Version of the weights that sampled the response (Ray rollout workers)."""

    # ---- tree rollouts (``turnrl.rollout.tree``)
    train: bool = True
    """False: the row shapes credit (returns, structure) but is not updated on."""
    copy_of: str | None = None
    """This row repeats the row at the same turn of that trajectory (no new step)."""
    pruned: bool = False
    """PATR pruned the branch after this turn."""

    # ---- Iterative GRPO (deployment, chat logs)
    persona: int | None = None
    """Index of the exploration persona in ``deploy.personas`` that produced the turn."""
    source_line: int | None = None
    """1-based line of the chat-log file the turn was imported from."""

    # ---- adapters
    agl: AglData | None = None
    """Agent Lightning pass-through data (``agl_*`` keys)."""

    extra: Mapping[str, Any] = field(default_factory=dict)
    """Every other JSON key of the line, in order, passed through unchanged."""

    def __post_init__(self) -> None:
        # Lists given for the sequence fields are stored as tuples, so a record
        # built in code is as immutable as one read from a file.
        for name in ("prompt", "prompt_ids", "response_ids", "logprobs", "tags"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
