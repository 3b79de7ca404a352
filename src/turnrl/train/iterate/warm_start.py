"""What Iterative GRPO's warm start learns from: the environment's demonstrations (and
``warm_start.persona_styles``' ones), or, without an environment, the imported logs."""

from __future__ import annotations

from typing import Any

from turnrl.envs import demonstration
from turnrl.train.iterate.config import IterateConfig
from turnrl.train.iterate.explore import with_instruction
from turnrl.train.update.sft import TurnExample, conversation_examples, demonstration_examples
from turnrl.types import Task, TurnRecord


def warm_start_examples(
    policy: Any,
    config: IterateConfig,
    train_tasks: list[Task] | None,
    log_records: list[TurnRecord] | None,
) -> list[TurnExample]:
    """SFT rows of the warm start: demonstrations on ``train_tasks`` (None: the run has
    no environment, and the rows are ``log_records``' exact tokens)."""
    if train_tasks is None:
        assert log_records is not None
        return [
            TurnExample(list(r.prompt_ids or ()), list(r.response_ids or ())) for r in log_records
        ]
    return demonstration_examples(
        policy,
        config.env.name,
        train_tasks,
        seed=config.seed,
        tool_fraction=config.warm_start.tool_fraction,
        easy_tool_fraction=config.warm_start.easy_tool_fraction,
        env_kwargs=demonstration_kwargs(config),
        mix=config.warm_start.mix,
    ) + persona_examples(policy, config, train_tasks)


def demonstration_kwargs(config: IterateConfig) -> dict[str, Any]:
    """The environment's arguments for demonstrations, with ``warm_start.style`` where
    the environment (a negotiation setting) takes one."""
    from turnrl.envs.negotiation import SETTINGS

    kwargs = dict(config.env.env_kwargs)
    style = config.warm_start.style
    if style is not None and config.env.name in SETTINGS:
        kwargs["style"] = style
    return kwargs


def persona_examples(
    policy: Any, config: IterateConfig, train_tasks: list[Task]
) -> list[TurnExample]:
    """Demonstrations of ``warm_start.persona_styles``, instruction in the system message."""
    name = config.env.name
    examples: list[TurnExample] = []
    for instruction, style in config.warm_start.persona_styles.items():
        kwargs = {**config.env.env_kwargs, "style": style}
        for task in train_tasks:
            messages = demonstration(name, task, **kwargs)
            examples += conversation_examples(policy, with_instruction(messages, instruction))
    return examples
