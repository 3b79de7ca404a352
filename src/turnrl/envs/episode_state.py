"""A base for environments whose whole episode state is one immutable value.

The calculator, FrozenLake and the negotiation settings keep everything that
changes during an episode in a frozen dataclass held in ``self._state`` and
replace it on every step. Snapshots are then the state itself (nothing can
change it), restoring is an assignment checked for the right type, and every
step first makes sure an episode is running.
"""

from __future__ import annotations

from typing import Any, ClassVar

from turnrl.types import Env


class ImmutableStateEnv(Env):
    """``snapshot``/``restore``/``_require_state`` for a frozen ``self._state``.

    Subclasses set ``state_type`` (the frozen dataclass, which has a ``done``
    field) and start with ``self._state = None``.
    """

    state_type: ClassVar[type]
    _state: Any

    def snapshot(self) -> Any:
        return self._require_state()

    def restore(self, snapshot: Any) -> None:
        if not isinstance(snapshot, self.state_type):
            raise TypeError(f"not a {type(self).__name__} snapshot: {type(snapshot).__name__}")
        self._state = snapshot

    def _require_state(self) -> Any:
        """The running episode's state; raises before ``reset`` and after the end."""
        if self._state is None:
            raise RuntimeError("call reset(task) before step()")
        if self._state.done:
            raise RuntimeError("episode is over; call reset(task) to start another")
        return self._state
