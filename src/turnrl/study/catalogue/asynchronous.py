"""Asynchronous training (issue #37): does sampling one version ahead change what
``make demo``'s recipe learns? The calculator recipe at ``train.max_staleness`` 1
against 0 (the synchronous trainer, bit for bit) over the demo-seeds seeds
(docs/async.md, "Learning at K = 1")."""

from __future__ import annotations

from turnrl.study.catalogue.demo import DEMO_METRICS
from turnrl.study.declaration import Arm, Metric, Study, Table

STALENESS = (
    Metric("staleness_mean", "versions behind (mean)", "mean", 2),
    Metric("staleness_max", "versions behind (max)", "mean", 2),
)
"""How far behind the learner the sampled rollouts were, averaged over the run's steps
(K = 0 runs do not log it; at K = 1 every step but the first and those after a
checkpoint is 1)."""

ASYNC_DEMO_SEEDS = Study(
    name="async-demo-seeds",
    title="`make demo`'s recipe sampled one version ahead (train.max_staleness = 1) against"
    " synchronously, six seeds, 105k-parameter character model",
    config="examples/calculator.toml",
    arms=(Arm("K0", ("train.max_staleness=0",)), Arm("K1", ("train.max_staleness=1",))),
    # the demo-seeds seeds; within a seed both arms run the same warm start (the recipe's
    # own, at that seed), so the seed is the unit of inference and each arm pairs by it
    seeds=tuple(range(6)),
    overrides=("logging.report=false",),
    baseline="K0",
    outcome="eval_success",
    doc="docs/async.md",
    tables=(
        Table("arms", "arms", DEMO_METRICS),
        Table("paired", "paired", (DEMO_METRICS[0], DEMO_METRICS[3])),
        Table("seeds", "seeds", DEMO_METRICS[:1] + DEMO_METRICS[3:], extra=STALENESS),
    ),
    curve="eval_success",
    minutes_per_cell=2.5,
)
