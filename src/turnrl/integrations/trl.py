"""turnrl inside TRL (extra ``trl``): multi-turn env rollouts and per-token turnrl advantages.

Two pieces, usable together or apart:

* ``make_rollout_func(make_env, tasks, ...)`` returns a TRL ``rollout_func``: for
  each prompt (a ``task_id``; build the dataset with ``task_dataset``) it runs
  ``num_generations`` multi-turn episodes of a turnrl ``Env`` with the trainer's
  own model (``turnrl.rollout.run_episodes`` through an ``HFPolicy``), and hands
  TRL one completion per episode: every assistant response and every
  environment observation after the initial prompt, with ``env_mask`` = 1 on the
  sampled tokens and 0 on the observation tokens (TRL then trains only on the
  former). Per-episode fields (``turnrl_task_id``, ``turnrl_turn_rewards``,
  ``turnrl_state_keys``, ``turnrl_outcome``) go to the reward functions and to
  the trainer below; ``outcome_reward`` is a reward function that returns
  ``turnrl_outcome``.
* ``TurnRLGRPOTrainer`` is a ``GRPOTrainer`` whose advantages come from a turnrl
  estimator: after TRL has generated and scored a batch, each completion's
  loss mask (``completion_mask * tool_mask``) is split into assistant segments
  (one per turn), a ``TurnTable`` is built (task = ``turnrl_task_id``, else the
  prompt group; per-turn rewards = ``turnrl_turn_rewards``, else TRL's reward on
  the last turn), and the estimator's per-turn advantages replace TRL's
  per-sequence ones as a ``(B, T)`` tensor, which TRL's loss accepts.

Limits (departures from a full integration):

* one process only (``accelerator.num_processes == 1``): a turnrl group must see
  all of its rows, and TRL splits a batch across processes;
* A2TGPO's per-turn clip factor is not applied (TRL's clip range is global);
* TRL's logged ``advantages`` column is still its own per-sequence GRPO value;
* generation uses turnrl's batched HF sampler on the trainer's model, not vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from trl import GRPOTrainer

from turnrl.credit import compute_credit, get_estimator
from turnrl.integrations.tokens import (
    TokenTurns,
    build_table,
    context_node_ids,
    scatter_to_tokens,
    split_turns,
)
from turnrl.policy import HFPolicy
from turnrl.rollout.runner import run_episodes
from turnrl.types import Env, Task, TurnRecord

EXTRA_FIELDS = ("turnrl_task_id", "turnrl_turn_rewards", "turnrl_state_keys", "turnrl_outcome")


def task_dataset(tasks: Sequence[Task]) -> Any:
    """A ``datasets.Dataset`` with one row per task; its ``prompt`` is the task id."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [task.task_id for task in tasks]})


def episode_completion(records: Sequence[TurnRecord]) -> dict[str, Any]:
    """One episode's turn records -> TRL's ``prompt_ids``/``completion_ids``/``env_mask``.

    The completion is everything after the initial prompt: each turn's response
    (mask 1) and, between turns, the tokens the runner appended to the context
    (mask 0). Log-probs are the sampled ones (0 on observation tokens).
    """
    ordered = sorted(records, key=lambda r: r.turn)
    prompt = list(ordered[0].prompt_ids or ())
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for record in ordered:
        context = record.prompt_ids or ()
        response = list(record.response_ids or ())
        seen = len(prompt) + len(completion)
        if list(context[:seen]) != prompt + completion:
            raise ValueError(
                f"trajectory {record.traj_id!r}, turn {record.turn}: its prompt does not "
                "extend the previous turn's context (contexts must grow by appending tokens)"
            )
        observation = list(context[seen:])
        completion += observation + response
        mask += [0] * len(observation) + [1] * len(response)
        logprobs += [0.0] * len(observation) + list(record.logprobs or ())
    return {
        "prompt_ids": prompt,
        "completion_ids": completion,
        "env_mask": mask,
        "logprobs": logprobs,
        "turnrl_task_id": ordered[0].task_id,
        "turnrl_turn_rewards": [r.reward for r in ordered],
        "turnrl_state_keys": [r.state_key for r in ordered],
        "turnrl_outcome": float(sum(r.reward for r in ordered)),
    }


def make_rollout_func(
    make_env: Callable[[], Env],
    tasks: Sequence[Task],
    *,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    max_turns: int = 8,
    seed: int = 0,
) -> Callable[[list[Any], Any], dict[str, list[Any]]]:
    """A TRL ``rollout_func`` running turnrl episodes; prompts are task ids of ``tasks``.

    TRL hands each prompt ``num_generations`` times in a row (its RepeatSampler);
    each such run of prompts becomes ``num_generations`` episodes of that task, one
    completion per prompt row, in TRL's order. Sampling is seeded by ``seed`` and
    the trainer's global step.
    """
    by_id = {task.task_id: task for task in tasks}

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        unknown = [p for p in prompts if p not in by_id]
        if unknown:
            raise ValueError(f"prompts must be task ids of the given tasks; unknown: {unknown[:3]}")
        model = trainer.accelerator.unwrap_model(trainer.model)
        training = model.training
        group = trainer.num_generations if training else trainer.num_generations_eval
        unique = prompts[::group]
        if len(prompts) != len(unique) * group or any(
            prompts[i] != unique[i // group] for i in range(len(prompts))
        ):
            raise ValueError(
                f"expected each prompt repeated {group} times in a row (TRL's RepeatSampler)"
            )
        model.eval()  # sampling uses the KV cache (off under gradient checkpointing in train mode)
        try:
            batch = run_episodes(
                HFPolicy(model, trainer.processing_class),
                make_env,
                [by_id[p] for p in unique],
                group_size=group,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=seed * 100_003 + int(trainer.state.global_step),
                max_turns=max_turns,
            )
        finally:
            model.train(training)
        per_traj: dict[str, list[TurnRecord]] = {}
        for record in batch.records:
            per_traj.setdefault(record.traj_id, []).append(record)
        episodes = [episode_completion(per_traj[e.traj_id]) for e in batch.episodes]
        return {key: [e[key] for e in episodes] for key in episodes[0]}

    return rollout_func


def exact_node_ids(
    turns: TokenTurns, tasks: Sequence[Any], output: Mapping[str, Any]
) -> list[list[Any]]:
    """Per completion, one node id per turn (exact context: task, prompt, earlier tokens).

    The context of a turn is the unpadded prompt plus the completion tokens before
    the turn's segment (``turnrl.integrations.tokens.context_node_ids``).
    """
    prompt_mask = output["prompt_mask"].detach().cpu().numpy().astype(bool)
    prompt_ids = output["prompt_ids"].detach().cpu().numpy()
    prompts = [ids[keep].tolist() for ids, keep in zip(prompt_ids, prompt_mask, strict=True)]
    task_per_turn = np.array([tasks[r] for r in turns.row], dtype=object)
    completions = output["completion_ids"].detach().cpu().numpy()
    nodes = context_node_ids(task_per_turn, prompts, completions, turns)
    return [
        list(nodes[turns.first[r] : turns.first[r] + turns.count[r]]) for r in range(len(tasks))
    ]


def outcome_reward(completions: list[Any], turnrl_outcome: list[float], **_: Any) -> list[float]:
    """TRL reward function: the episode's outcome (sum of its turn rewards)."""
    return [float(x) for x in turnrl_outcome]


class TurnRLGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with per-token advantages from turnrl estimator ``turnrl_estimator``.

    ``turnrl_params`` are the estimator's options. See the module docstring for
    what is read and the limits.
    """

    def __init__(
        self,
        *args: Any,
        turnrl_estimator: str = "turn_group",
        turnrl_params: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.turnrl_estimator = get_estimator(turnrl_estimator).name
        self.turnrl_params = dict(turnrl_params or {})
        self._turnrl_rewards: torch.Tensor | None = None
        super().__init__(*args, **kwargs)
        if self.accelerator.num_processes != 1:
            raise NotImplementedError(
                "TurnRLGRPOTrainer runs in one process only: turnrl groups must see all their rows"
            )

    def _calculate_rewards(self, inputs: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        rewards_per_func = super()._calculate_rewards(inputs, *args, **kwargs)
        weights = self.reward_weights.to(rewards_per_func.device)
        self._turnrl_rewards = torch.nansum(rewards_per_func * weights.unsqueeze(0), dim=1)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        output["advantages"] = self.turnrl_advantages(inputs, output)
        return output

    def turnrl_advantages(
        self, inputs: list[dict[str, Any]], output: Mapping[str, Any]
    ) -> torch.Tensor:
        """``(B, T)`` float32 advantages of the estimator on this batch (see module doc)."""
        completion_mask = output["completion_mask"]
        mask = (
            completion_mask if "tool_mask" not in output else completion_mask * output["tool_mask"]
        )
        mask_np = mask.detach().cpu().numpy().astype(bool)
        turns = split_turns(mask_np, one_turn_per_row=False)
        mode = "train" if self.model.training else "eval"
        group = self.num_generations if mode == "train" else self.num_generations_eval
        tasks = [row.get("turnrl_task_id", f"group-{i // group}") for i, row in enumerate(inputs)]
        rewards = np.zeros(mask_np.shape, dtype=np.float64)
        for r, row in enumerate(inputs):
            per_turn = row.get("turnrl_turn_rewards")
            if per_turn is None:
                per_turn = [0.0] * (int(turns.count[r]) - 1) + [self._trl_reward(r)]
            elif len(per_turn) != int(turns.count[r]):
                if mask_np[r].any():
                    raise ValueError(
                        f"completion {r}: {len(per_turn)} turn rewards but {int(turns.count[r])} "
                        "assistant segments in its loss mask"
                    )
                per_turn = [float(sum(per_turn))]  # fully masked row: one empty turn
            starts = turns.start[turns.first[r] : turns.first[r] + len(per_turn)]
            np.add.at(rewards[r], starts, per_turn)
        state_keys = [row.get("turnrl_state_keys") for row in inputs]
        if any(s is not None and len(s) != int(turns.count[r]) for r, s in enumerate(state_keys)):
            state_keys = [None] * len(inputs)  # truncated rows: drop state keys rather than guess
        node_ids = None
        if get_estimator(self.turnrl_estimator).group_key == "node":
            node_ids = exact_node_ids(turns, tasks, output)
        table = build_table(
            turns,
            rewards,
            task_id=tasks,
            state_key=state_keys,
            node_id=node_ids,
            source="<trl batch>",
        )
        credit = compute_credit(table, self.turnrl_estimator, **self.turnrl_params)
        tokens = torch.from_numpy(scatter_to_tokens(credit.advantages, turns))
        return tokens.to(completion_mask.device)

    def _trl_reward(self, row: int) -> float:
        if self._turnrl_rewards is None:
            raise RuntimeError("no TRL rewards were computed for this batch")
        value = float(self._turnrl_rewards[row])
        return 0.0 if np.isnan(value) else value
