"""Iterative GRPO on the negotiation games (docs/iterative-grpo.md)."""

from __future__ import annotations

from turnrl.study.declaration import (
    ITERATE,
    TRAIN,
    Arm,
    Metric,
    Setting,
    Study,
    Table,
    WarmStarts,
)

ITERATE_VALUE = (
    Metric("eval_return", "eval value", digits=3),
    Metric("eval_success", "eval deal rate", digits=3),
    Metric("eval_malformed_rate", "eval malformed turns", digits=3),
    # one row per equal batch (an iteration's 128 conversations, an online step's 16):
    # their mean is the mean value of every conversation the arm deployed
    Metric("return", "deployed value (all 384)", "mean", digits=3),
)
Q_QUALITY = (
    Metric("q_heldout_loss", "held-out MSE", digits=3),
    Metric("q_heldout_baseline_loss", "constant-mean MSE", digits=3),
    Metric("q_heldout_spearman", "held-out Spearman"),
    Metric("q_heldout_within_state_pearson", "within-state corr."),
)
Q_EXTRA = (
    Metric("improve_kl_ref", "KL to deployed (last)", digits=3),
    Metric("improve_q_spread", "within-state Q std (last)", digits=3),
)
NO_STD_FLOOR = "improve.std_floor=0.0"
PERSONA = "Negotiate hard."
"""The exploration persona of the persona-aware arms (examples/iterative_grpo/run.py)."""


def _iterate_arm(name: str, *overrides: str) -> Arm:
    """An Iterative GRPO arm: ``turnrl iterate`` with the setting's recipe and ``overrides``."""
    return Arm(name, (f"label={name}", "threads=1", *overrides))


ONLINE_ARM = Arm(
    "online-grpo",
    ("label=online-grpo",),
    config="examples/iterative_grpo/online.toml",
    program=TRAIN,
    seed_override="train.seed={seed}",
)
"""Online multi-turn GRPO from the same warm start, at the same deployed conversations."""

ITERATE_SETTINGS = (
    Setting("haggle", ("env.name=haggle",)),
    Setting("split_money", ("env.name=split_money",)),
)


def _iterate_study(name: str, title: str, arms: tuple[Arm, ...], **fields: object) -> Study:
    """A study of examples/iterative_grpo/run.py's matrix: per negotiation setting and
    seed, one warm start (``turnrl iterate`` with ``iterations=0``) that every arm starts
    from; Iterative GRPO arms run ``turnrl iterate`` (3 iterations x 128 conversations),
    the online arm ``turnrl train`` (24 steps x 16 conversations)."""
    warm_overrides = ("iterations=0", "threads=1", *fields.pop("warm_overrides", ()))  # type: ignore[misc]
    return Study(
        name=name,
        title=title,
        config="examples/iterate_haggle.toml",
        program=ITERATE,
        seed_override="seed={seed}",
        arms=arms,
        seeds=(0, 1, 2),
        settings=ITERATE_SETTINGS,
        warm_starts=WarmStarts(
            count=3,
            per_seed=True,
            per_setting=True,
            overrides=warm_overrides,
            seed_override="seed={warm}",
        ),
        doc="docs/iterative-grpo.md",
        # no curve: the arms log per iteration (iterate) and per step (train), so they
        # share no x axis; the per-seed start -> end values are in the tables
        **fields,  # type: ignore[arg-type]
    )


ITERATIVE_ARMS = ("paper", "mean-only+explore", "format-check", "format-check+std-floor")

ITERATIVE_GRPO = _iterate_study(
    "iterative-grpo",
    "Iterative GRPO vs online GRPO at equal deployed conversations (weak warm start)",
    (
        # the paper's q estimator: every candidate scored by Q, std within the state
        _iterate_arm("paper", "improve.reject_malformed=false", NO_STD_FLOOR),
        _iterate_arm(
            "mean-only+explore",
            "improve.reject_malformed=false",
            "improve.use_std=false",
            "deploy.temperatures=[1.0, 1.5]",
            NO_STD_FLOOR,
        ),
        _iterate_arm("format-check", "improve.reject_malformed=true", NO_STD_FLOOR),
        _iterate_arm(
            "format-check+std-floor", "improve.reject_malformed=true", "improve.std_floor=0.05"
        ),
        _iterate_arm(
            "q-from-policy",
            "improve.reject_malformed=true",
            "improve.std_floor=0.05",
            "q.init=policy",
        ),
        ONLINE_ARM,
    ),
    baseline="online-grpo",
    tables=(
        Table("arms", "arms", ITERATE_VALUE),
        Table("paired", "paired", ITERATE_VALUE[:1] + ITERATE_VALUE[2:]),
        Table(
            "paired-paper",
            "paired",
            ITERATE_VALUE[:1] + ITERATE_VALUE[2:],
            arms=(*ITERATIVE_ARMS, "q-from-policy"),
            baseline="paper",
        ),
        Table(
            "paired-q-init",
            "paired",
            (
                *ITERATE_VALUE[:1],
                *ITERATE_VALUE[3:],
                # iteration 1: both arms fit Q on the same deployed batch
                Metric("q_heldout_loss", "held-out MSE, iteration 1", "first", 3),
                Metric(
                    "q_heldout_within_state_pearson", "within-state corr., iteration 1", "first"
                ),
            ),
            arms=("format-check+std-floor", "q-from-policy"),
            baseline="format-check+std-floor",
        ),
        Table(
            "q-quality",
            "seeds",
            Q_QUALITY,
            extra=Q_EXTRA,
            arms=("paper", "format-check", "format-check+std-floor", "q-from-policy"),
        ),
    ),
    minutes_per_cell=2.0,
)

ITERATIVE_PERSONA = _iterate_study(
    "iterative-persona",
    "Iterative GRPO vs online GRPO from the persona-aware warm start",
    (
        _iterate_arm("format-check", "improve.reject_malformed=true", NO_STD_FLOOR),
        _iterate_arm(
            "format-check+persona-explore",
            "improve.reject_malformed=true",
            f'deploy.personas=["", "{PERSONA}"]',
            NO_STD_FLOOR,
        ),
        ONLINE_ARM,
    ),
    # weak and strong demonstrations, the strong ones under the persona instruction
    warm_overrides=(f'warm_start.persona_styles={{ "{PERSONA}" = "strong" }}',),
    baseline="online-grpo",
    tables=(
        Table("arms", "arms", ITERATE_VALUE),
        Table("paired", "paired", ITERATE_VALUE[:1] + ITERATE_VALUE[2:]),
        Table(
            "paired-explore",
            "paired",
            ITERATE_VALUE[:1] + ITERATE_VALUE[2:],
            arms=("format-check", "format-check+persona-explore"),
            baseline="format-check",
        ),
        Table(
            "q-quality",
            "seeds",
            Q_QUALITY,
            extra=Q_EXTRA,
            arms=("format-check", "format-check+persona-explore"),
        ),
    ),
    minutes_per_cell=2.0,
)
