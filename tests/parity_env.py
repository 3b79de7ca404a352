"""The tests' ``parity`` environment under a name any process can import:
``env.name = "parity_env:spec"`` (with tests/ on ``PYTHONPATH``). Ray workers build
their environments by name and never import conftest, which registers ``parity``."""

from conftest import ParityEnv, parity_demonstration, parity_tasks
from turnrl.envs import EnvSpec


def spec() -> EnvSpec:
    """What conftest registers as ``parity``."""
    return EnvSpec(ParityEnv, parity_tasks, parity_demonstration)
