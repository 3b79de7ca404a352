"""Upper bounds of a config's sizes, refused at validation (docs/config-errors.md).

A size of ``10**9`` (a typo, a unit mix-up) used to reach the code that allocates it
and end in a ``MemoryError`` traceback after the warm start, or never end. These bounds
are far above any run this project makes on one machine (its largest recipes use 16
rollouts per task, 64 tasks per step and 4096 training tasks) and far below what
exhausts memory at once; each section's ``check`` refuses a value above them, naming
the field and the bound. A run that really needs more edits the constant.
"""

from __future__ import annotations

WHY = "an upper bound against running out of memory, turnrl.train.bounds"
"""What a refusal says of the bound (the section checks pass it to ``Problems.at_most``)."""

MAX_GROUP_SIZE = 1024
"""``rollout.group_size``: rollouts (or branches) per task."""

MAX_TASKS_PER_STEP = 4096
"""``rollout.tasks_per_step``: distinct tasks per step."""

MAX_ROLLOUTS_PER_STEP = 65536
"""``rollout.group_size * rollout.tasks_per_step``: every rollout of a step is held in
memory until its update."""

MAX_TASK_POOL = 1_000_000
"""``env.n_train_tasks``, ``env.n_eval_tasks``, ``tasks.n_train``, ``tasks.n_eval`` and
``warm_start.teacher_tasks``: tasks generated and held at once."""

MAX_BATCH = 65536
"""``warm_start.batch_size`` and ``train.minibatch_size``: sequences in one forward."""

MAX_TINY_HIDDEN = 8192
"""``policy.hidden`` of the ``tiny`` model."""

MAX_TINY_LAYERS = 256
"""``policy.layers`` of the ``tiny`` model."""

MAX_LORA_RANK = 4096
"""``policy.lora_rank``."""

MAX_CONCURRENCY = 4096
"""``agent.concurrency``: agents running at once (each may be a process)."""

MAX_EVAL_SAMPLES = 1024
"""``train.eval_samples``: samples per evaluation task."""

MAX_WARM_START_LR = 1.0
"""``warm_start.lr``: a supervised rate above 1 diverges at once with Adam, and one above
float32's range (3.4e38) overflows inside the optimiser step."""
