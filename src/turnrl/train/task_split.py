"""A run's training tasks and its held-out evaluation tasks, from the env config's seed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from turnrl.train.config import EnvConfig
from turnrl.train.seeds import derive_seed
from turnrl.types import Task


@dataclass(frozen=True)
class TaskSplit:
    """A run's fixed training task pool and its held-out evaluation tasks."""

    train: list[Task]
    eval: list[Task]

    @property
    def eval_unseen(self) -> float:
        """Share of evaluation tasks not in the training pool (small pools overlap)."""
        train_ids = {t.task_id for t in self.train}
        return float(np.mean([t.task_id not in train_ids for t in self.eval]))


def task_split(env: EnvConfig) -> TaskSplit:
    """Training tasks from ``env.seed``, evaluation tasks from a derived seed. Small
    pools (the calculator's easy problems) overlap: ``TaskSplit.eval_unseen`` says
    how much."""
    from turnrl.envs import make_tasks

    return TaskSplit(
        train=make_tasks(env.name, env.n_train_tasks, env.seed, **env.task_kwargs),
        eval=make_tasks(
            env.name, env.n_eval_tasks, derive_seed(env.seed, "eval_tasks"), **env.task_kwargs
        ),
    )
