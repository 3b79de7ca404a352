"""turnrl: multi-turn RL for LLM agents with per-turn credit assignment you can audit."""

from turnrl.errors import TurnRecordError
from turnrl.table import TurnTable

__all__ = ["TurnRecordError", "TurnTable"]
__version__ = "0.1.0"
