"""Optional: textarena's IteratedUltimatumGame as a turnrl :class:`~turnrl.types.Env`.

The game itself (rules, round accounting, prompts, invalid-move handling) is
textarena's ``IteratedUltimatumGameEnv``; this adapter plays its player 0 (the
proposer in every round) with the agent, and its player 1 with the scripted
responder of :mod:`.ultimatum` (:func:`~.ultimatum.judge`: hidden fairness
threshold, grudges, anchoring; it never quits, as textarena's rules have no
quitting). Tasks are :func:`~.ultimatum.ultimatum_tasks`.

The agent may write textarena's own action (``[Offer: $30]``) or the compact
``<offer>30</offer>`` (translated). Messages are textarena's: the system message
is its player prompt, each observation the game's messages since the agent's
last turn (the echo of the agent's own action is dropped). An invalid move is
textarena's to judge: the agent is told and may retry once; a second invalid move
in a row forfeits the game. The reward, paid at the end, is the agent's total /
(pool * rounds), as in :mod:`.ultimatum`.

textarena is imported lazily (tested with ``textarena==0.7.4``): importing this
module works without it, and :meth:`TextArenaUltimatumEnv.reset` raises an
``ImportError`` that says how to install it. Seeds are not passed to textarena,
whose ``State`` would reseed Python's global ``random``; this game draws nothing
at random anyway.

Snapshots deep-copy the textarena game (it is a plain mutable object) together
with the responder's frozen state; restoring copies again, so a snapshot stays
reusable.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any

from turnrl.envs.negotiation.actions import Offer, parse_action
from turnrl.envs.negotiation.ultimatum import POT, Responder, UltimatumEnv, judge
from turnrl.types import Env, Message, StepResult, Task

INSTALL_HINT = "textarena is not installed; pip install 'textarena==0.7.4' (or turnrl[textarena])"


def _game_class() -> Any:
    """textarena's IteratedUltimatumGameEnv class (lazy import)."""
    try:
        from textarena.envs.IteratedUltimatumGame.env import IteratedUltimatumGameEnv
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return IteratedUltimatumGameEnv


def _is_admin(kind: Any) -> bool:
    return getattr(kind, "name", "") == "GAME_ADMIN"


@dataclass(frozen=True)
class _Snapshot:
    """A private deep copy of the textarena game plus the adapter's own state."""

    game: Any
    task: Task
    responder: Responder
    turn: int
    done: bool


def _as_textarena(response: str) -> str:
    """The move sent to textarena: a turnrl ``<offer>X</offer>`` becomes ``[Offer: $X]``;
    anything else goes as written (textarena parses ``[Offer: $X]`` itself)."""
    parsed = parse_action(response, UltimatumEnv.FORMAT)
    return f"[Offer: ${round(parsed['share'])}]" if isinstance(parsed, Offer) else response


class TextArenaUltimatumEnv(Env):
    """textarena's IteratedUltimatumGame, agent as proposer, scripted responder."""

    def __init__(self, *, rounds: int = 6, pool: int = POT) -> None:
        if rounds < 1 or pool < 1:
            raise ValueError(f"need rounds >= 1 and pool >= 1; got {rounds}, {pool}")
        self.rounds = rounds
        self.pool = pool
        self._state: _Snapshot | None = None

    def reset(self, task: Task) -> list[Message]:
        game = _game_class()(pool=self.pool, max_turns=2 * self.rounds, alternate_roles=False)
        game.reset(num_players=2, seed=None)
        _, observation = game.get_observation()
        prompt = "\n".join(m for _, m, kind in observation if getattr(kind, "name", "") == "PROMPT")
        rest = self._text(observation, skip_prompt=True)
        threshold = float(task.payload["persona"]["threshold"])
        self._state = _Snapshot(game, task, Responder(threshold=threshold), 0, False)
        return [
            {"role": "system", "content": prompt.strip()},
            {"role": "user", "content": rest},
        ]

    def check_response(self, task: Task, response: str) -> str | None:
        """What textarena would refuse, checked with its own offer pattern: the
        proposer must make an offer (``[Offer: $X]`` or ``<offer>X</offer>``) with
        ``0 <= X <= pool``."""
        match = _game_class()(pool=self.pool).offer_pattern.search(_as_textarena(response))
        if match is None:
            return "Proposer must make an offer using the format [Offer: $X]."
        if not 0 <= int(match.group(1)) <= self.pool:
            return f"Offer must be between $0 and ${self.pool}."
        return None

    def step(self, response: str) -> StepResult:
        state = self._require_state()
        game, responder = state.game, state.responder
        done, _ = game.step(_as_textarena(response))
        accepted = None
        if not done and game.state.current_player_id == 1:  # a valid offer: the responder
            game.get_observation()  # drain the responder's view
            share = float(game.state.game_state["current_offer"])
            responder, accepted = judge(state.task.payload["persona"], responder, share)
            done, _ = game.step("[Accept]" if accepted else "[Reject]")
        _, observation = game.get_observation()
        invalid = next((m for _, m, kind in observation if _is_admin(kind)), None)
        forfeit = bool(done) and accepted is None  # only a second invalid move ends it here
        if forfeit:
            invalid = "a second invalid move in a row: forfeit"
        self._state = _Snapshot(game, state.task, responder, state.turn + 1, bool(done))
        total = float(game.state.game_state["player_totals"][0])
        value = total / (self.pool * self.rounds)
        info: dict[str, Any] = {
            "turn": state.turn,
            "tool_call": False,
            "malformed": invalid is not None,
            "error": invalid,
            "accepted": accepted,
            "outcome": ("forfeit" if forfeit else "complete") if done else None,
            "deal": total > 0 if done else None,
            "correct": total > 0 if done else None,
            "value": value if done else None,
            "truncated": False,
            "state_key": self.state_key(),
        }
        if done:
            return StepResult(None, value, True, info)
        return StepResult({"role": "user", "content": self._text(observation)}, 0.0, False, info)

    def snapshot(self) -> _Snapshot:
        state = self._require_state()
        return _Snapshot(copy.deepcopy(state.game), state.task, state.responder, state.turn, False)

    def restore(self, snapshot: Any) -> None:
        if not isinstance(snapshot, _Snapshot):
            raise TypeError(f"not a TextArenaUltimatumEnv snapshot: {type(snapshot).__name__}")
        game = copy.deepcopy(snapshot.game)
        self._state = _Snapshot(
            game, snapshot.task, snapshot.responder, snapshot.turn, snapshot.done
        )

    def state_key(self) -> str | None:
        if self._state is None:
            return None
        s = self._state
        text = f"{s.task.task_id}\x1f{s.turn}\x1f{s.game.state.game_state!r}\x1f{s.responder!r}"
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    @staticmethod
    def _text(observation: list[tuple[int, str, Any]], *, skip_prompt: bool = False) -> str:
        """The game's messages for the agent, without the echo of its own action."""
        lines = []
        for sender, message, kind in observation:
            if sender == 0 or (skip_prompt and getattr(kind, "name", "") == "PROMPT"):
                continue
            lines.append(message.strip())
        return "\n".join(lines)

    def _require_state(self) -> _Snapshot:
        if self._state is None:
            raise RuntimeError("call reset(task) before step()")
        if self._state.done:
            raise RuntimeError("episode is over; call reset(task) to start another")
        return self._state


def demonstration(task: Task, style: str = "medium", **env_kwargs: Any) -> list[Message]:
    """A scripted proposer (:func:`.ultimatum.agent`) playing the textarena game, in the
    compact action language."""
    from turnrl.envs.negotiation.ultimatum import agent

    env = TextArenaUltimatumEnv(**env_kwargs)
    messages = env.reset(task)
    proposer = agent(task, env.rounds, style)
    result: StepResult | None = None
    last_reply = ""
    while result is None or not result.done:
        response = proposer(last_reply)
        messages.append({"role": "assistant", "content": response})
        result = env.step(response)
        last_reply = "Yes." if result.info["accepted"] else "No."
        if result.observation is not None:
            messages.append(result.observation)
    return messages
