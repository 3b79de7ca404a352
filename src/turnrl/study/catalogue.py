"""Every declared study of this repository, and the measurements that are not
``turnrl train`` matrices but write doc tables too.

Paths are relative to the repository root (studies run from a checkout: their
recipes live in ``examples/``). ``turnrl study list`` prints them with their cell
counts and times; ``make study-<name>`` runs one and summarises it.

Longer than the house's ~500 lines on purpose: it is data, one declaration per
study read top to bottom like a table of contents, and every doc table's marker
names an entry here; splitting it would scatter that table of contents.
"""

from __future__ import annotations

from dataclasses import dataclass

from turnrl.errors import UsageError
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

DEMO_METRICS = (
    Metric("eval_success", "success"),
    Metric("eval_success_easy", "easy"),
    Metric("eval_success_hard", "hard"),
    Metric("eval_tool_rate", "tool rate"),
)

DEMO_SEEDS = Study(
    name="demo-seeds",
    title="`make demo`'s recipe over six seeds",
    config="examples/calculator.toml",
    arms=(Arm("calculator"),),
    seeds=tuple(range(6)),
    doc="README.md",
    tables=(
        Table(
            "seeds",
            "seeds",
            DEMO_METRICS,
            extra=(Metric("eval_success", "lowest success after step 0", "min_after_first"),),
        ),
        Table("arms", "arms", DEMO_METRICS[:1]),
    ),
    curve="eval_success",
    minutes_per_cell=2.5,
)

TREE_METRICS = (
    Metric("eval_success", "eval success", digits=3),
    Metric("eval_success", "mean over evals", "mean_after_first", digits=3),
)

TREE_ROLLOUTS = Study(
    name="tree-rollouts",
    title="Tree rollouts on FrozenLake 3x3: independent vs PATR vs RTPO at equal env steps",
    config="examples/frozenlake_independent.toml",
    program=(
        "{python}",
        "examples/tree/run.py",
        "--budget",
        "6000",
        "--eval-every",
        "1000",
        "--cell",
    ),
    arms=(
        Arm("independent"),
        Arm("patr", config="examples/frozenlake_patr.toml"),
        Arm("rtpo", config="examples/frozenlake_rtpo.toml"),
    ),
    seeds=(0, 1, 2),
    settings=(Setting("lr3e-4"), Setting("lr1e-3", ("train.lr=1e-3",))),
    warm_starts=WarmStarts(
        count=3, per_seed=True, program=("{python}", "-m", "turnrl.cli", "train", "--quiet")
    ),
    overrides=("train.threads=1",),
    resume_flag=None,
    baseline="independent",
    doc="docs/tree-rollouts.md",
    tables=(
        Table("arms", "arms", TREE_METRICS),
        Table("paired", "paired", TREE_METRICS),
        Table("seeds", "seeds", TREE_METRICS[:1]),
    ),
    curve="eval_success",
    curve_x="env_steps_physical",
    minutes_per_cell=1.0,
)

TOOL_OPEN = Metric("eval_tool_open_rate", "turn-0 tool rate", digits=3)
GROUPING_OUTCOMES = (
    TOOL_OPEN,
    Metric("eval_return", "return", digits=3),
    Metric("eval_success", "success", digits=3),
    Metric("eval_turns", "turns", digits=3),
)


def _estimator_arm(name: str, estimator: str, params: str = "{}", *extra: str) -> Arm:
    return Arm(
        name,
        (f"label={name}", f"credit.estimator={estimator}", f"credit.params={params}", *extra),
    )


GROUPING_LEARNING = Study(
    name="grouping-learning",
    title="Grouping experiment, learning runs: grpo_mixed vs grpo vs node (token-mean, all turns)",
    config="examples/grouping/medium.toml",
    arms=tuple(
        _estimator_arm(name, name, "{}", "train.aggregation=token-mean")
        for name in ("grpo_mixed", "grpo", "node")
    ),
    seeds=tuple(range(5)),
    settings=(
        Setting("cost0.4-steps60", ("env.env_kwargs.turn_cost=0.4", "train.steps=60")),
        Setting("cost0.4-steps30", ("env.env_kwargs.turn_cost=0.4", "train.steps=30")),
        Setting("cost0.2-steps60", ("env.env_kwargs.turn_cost=0.2", "train.steps=60")),
    ),
    # the frozen warm start of examples/grouping/gradient.py (same recipe, same seed)
    warm_starts=WarmStarts(count=1),
    overrides=("train.threads=1",),
    baseline="grpo_mixed",
    doc="docs/grouping-experiment.md",
    tables=(
        Table("arms", "arms", GROUPING_OUTCOMES),
        Table("paired", "paired", GROUPING_OUTCOMES),
    ),
    curve="eval_tool_open_rate",
    minutes_per_cell=1.0,
)

SEARCH_ARMS = (
    ("grpo", "grpo", "{}"),
    ("igpo", "igpo", "{}"),
    ("a2tgpo", "a2tgpo", "{}"),
    ("gigpo", "gigpo", "{}"),
    ("turn_group", "turn_group", "{}"),
    ("a2tgpo_joint", "a2tgpo", '{ig_norm = "joint"}'),
    ("a2tgpo_no_rescale", "a2tgpo", "{rescale = false}"),
    ("a2tgpo_no_clip", "a2tgpo", "{beta = 0.0}"),
)

SEARCH_METRICS = (
    Metric("eval_success", "success"),
    Metric("eval_success_hop1", "1-hop"),
    Metric("eval_success_hop2", "2-hop"),
    Metric("eval_success_hop3", "3-hop"),
    Metric("eval_tool_calls", "searches"),
    Metric("eval_turns", "turns"),
)
"""Held-out (greedy) success overall and by hop count, searches and turns per question."""

SEARCH_AGENT = Study(
    name="search-agent",
    title="Search agent (lookup): credit estimators, equal episodes",
    config="examples/lookup.toml",
    arms=tuple(_estimator_arm(*arm) for arm in SEARCH_ARMS),
    seeds=(0, 1, 2),
    # one warm start per seed: the seed spread then includes the warm start's (the
    # tables in the doc used one shared warm start: RL spread only)
    warm_starts=WarmStarts(count=1, per_seed=True),
    overrides=("train.threads=1",),
    baseline="grpo",
    doc="docs/search-agent.md",
    tables=(
        Table("arms", "arms", SEARCH_METRICS),
        Table("paired", "paired", SEARCH_METRICS[:1] + SEARCH_METRICS[4:5]),
    ),
    doc_tables=("details",),
    curve="eval_success",
    minutes_per_cell=5.0,
    regenerated="python examples/lookup/run.py (one warm start shared by all seeds)",
)

AGENT_METRICS = (
    Metric("eval_success", "success"),
    Metric("eval_success_hard", "success (hard)"),
    Metric("eval_tool_rate_hard", "tool rate (hard)"),
)
CALC_OPENAI_METRICS = (
    *AGENT_METRICS,
    Metric("eval_success_easy", "success (easy)"),
    Metric("eval_tool_rate_easy", "tool rate (easy)"),
)
"""With the easy half: where 20 steps of RL moved anything in the study below."""

AGENTS_CALC_OPENAI = Study(
    name="agents-calc-openai",
    title="The openai-client calculator agent: grpo_mixed vs grpo vs node",
    config="examples/agents/calc_openai.toml",
    arms=tuple(
        _estimator_arm(name, name, "{}", "warm_start.teacher=none")
        for name in ("grpo_mixed", "grpo", "node")
    ),
    seeds=(0, 1, 2),
    warm_starts=WarmStarts(
        count=1,
        overrides=("train.steps=0", "warm_start.teacher_tasks=512", "warm_start.steps=3000"),
    ),
    overrides=(
        "train.threads=1",
        "rollout.tasks_per_step=8",
        "rollout.group_size=4",
        "train.steps=20",
        "train.eval_every=10",
        "train.checkpoint_every=10",
    ),
    baseline="grpo_mixed",
    doc="docs/agents.md",
    tables=(
        Table("arms", "arms", CALC_OPENAI_METRICS),
        Table("paired", "paired", CALC_OPENAI_METRICS),
    ),
    curve="eval_success",
    minutes_per_cell=3.0,
)

CALCULATOR_SEEDS_TABLE = Table(
    "seeds", "seeds", (*DEMO_METRICS, Metric("eval_tool_rate_easy", "tool rate (easy)"))
)
"""Per seed: success (all, easy, hard) and tool rate (all, easy), start -> end."""

AGENTS_PARITY = Study(
    name="agents-parity",
    title="The calc_openai agent with the measured recipe: one warm start per seed",
    config="examples/agents/calc_openai.toml",
    # the recipe as it is: each cell trains its own warm start (train.seed = the seed:
    # teacher rollouts, SFT draws and initial weights), then 40 RL steps
    arms=(Arm("dr_grpo", ("label=dr_grpo",)),),
    seeds=(0, 1, 2, 3, 4),
    overrides=("train.threads=1",),
    doc="docs/agents.md",
    tables=(CALCULATOR_SEEDS_TABLE,),
    curve="eval_success",
    minutes_per_cell=6.0,
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

WARM_METRICS = (
    Metric("warm_tf_hard_call", "hard call exact", "first"),
    Metric("warm_tf_hard_result", "hard result exact", "first"),
    Metric("warm_tf_easy_call", "easy call exact", "first"),
    Metric("warm_tf_easy_result", "easy result exact", "first"),
    Metric("eval_success_hard", "greedy hard", "first"),
    Metric("eval_success_easy", "greedy easy", "first"),
    Metric("eval_tool_rate_hard", "tool rate (hard)", "first"),
)

AGENTS_WARM = Study(
    name="agents-warm",
    title="calc_openai warm starts alone: which recipe copies operands and results",
    config="examples/agents/calc_openai.toml",
    # each cell is a warm start only (train.steps=0): the teacher's rollouts, SFT, the
    # step-0 greedy evaluation and the teacher-forced check (warm_tf_*: the share of the
    # teacher's turns that greedy decoding reproduces exactly, per kind and turn)
    arms=(
        Arm("steps1100-draw", ("warm_start.steps=1100", "warm_start.mix=per_draw")),
        Arm("steps3000-draw", ("warm_start.steps=3000", "warm_start.mix=per_draw")),
        Arm("steps3000-task", ("warm_start.steps=3000", "warm_start.mix=per_task")),
    ),
    seeds=(0, 1, 2, 3, 4, 5, 6),
    overrides=("train.threads=1", "train.steps=0"),
    doc="docs/agents.md",
    tables=(Table("warm", "arms", WARM_METRICS),),
    minutes_per_cell=6.0,
)

AGENTS_SOLVER_CHECKER = Study(
    name="agents-solver-checker",
    title="Two roles (solver + checker) under role_turn with the measured recipe, per seed",
    config="examples/agents/solver_checker.toml",
    # the recipe as it is, as agents-parity: each cell trains its own warm start (the
    # scripted teacher's 512 problems, 3000 cosine SFT steps), then 40 RL steps of
    # role_turn without the std (AT-GRPO's groups, the dr_grpo form) at lr 3e-4
    arms=(Arm("role_turn", ("label=role_turn",)),),
    seeds=(0, 1, 2),
    overrides=("train.threads=1",),
    doc="docs/agents.md",
    tables=(
        Table(
            "seeds",
            "seeds",
            (*DEMO_METRICS, Metric("eval_tool_rate_hard", "tool rate (hard)")),
            # the warm start's teacher-forced check per role (warm_start_check.json),
            # given the teacher's decision: the solver's hard call (operands copied after
            # the checker's no), its answer after the tool, its direct easy answer
            extra=tuple(
                Metric(f"warm_tf_{kind}_solver_{turn}_forced", f"{kind} {turn} copied", "first")
                for kind, turn in (("hard", "call"), ("hard", "result"), ("easy", "direct"))
            ),
        ),
    ),
    curve="eval_tool_rate",
    minutes_per_cell=25.0,
)

PIPELINE_ARM = Arm(
    "pipeline",
    (
        "label=pipeline",
        "credit.estimator=grpo_mixed",
        'credit.params={lone = "raw"}',
        "train.aggregation=legacy-verl",
    ),
)
"""Agent Lightning v0.x + verl trained: every call one row grouped by task (verl's rule
for a lone row), then the pipeline's per-token weights (turnrl.train.update.legacy_pipeline:
shuffled token-mean micro-batches of 4 rows, ppo_mini_batch_size = the step's tasks).
Its prompt-length drop is calc_x's: ``max_prompt_length`` 4096 tokens drops nothing at
these lengths (teacher turns: 139-179 prompt tokens; logged RL steps: at most 211), so
``train.legacy_max_prompt_length`` stays 0 (no drop)."""

TOOL_PAYS = Setting("tool-pays", ("warm_start.teacher=none",))
"""6-digit products: the warm start copies them, the tool pays on hard problems."""
TOOL_DOES_NOT_PAY = Setting(
    "tool-does-not-pay",
    ("warm_start.teacher=none", "tasks.kwargs={hard_fraction = 0.5, hard_operands = [100, 316]}"),
)
"""5-digit products (3-digit operands up to 316): the tiny model never copies a 5-digit
result (examples/calculator.toml), so a call never pays there."""


def _agents_489(name: str, setting: Setting, title: str) -> Study:
    """One setting of the #489 study on calc_openai: the same arms, seeds, warm starts and
    tables. Two studies, not two settings of one, so that each setting is run, summarised
    and kept on its own (a machine lost the first run's directories between the settings:
    the tool-pays tables are kept from it, the other setting was rerun whole)."""
    return Study(
        name=name,
        title=title,
        config="examples/agents/calc_openai.toml",
        arms=(
            PIPELINE_ARM,
            *(_estimator_arm(arm, arm) for arm in ("grpo_mixed", "dr_grpo", "grpo")),
            *(_estimator_arm(arm, arm) for arm in ("node", "turn_group")),
        ),
        # 2 warm starts x 4 RL seeds = 8 pairs per cell; lr 3e-4 for every arm (the
        # recipe's, measured on this agent before the study, issue #25: dr_grpo 0.56 ->
        # 0.86 / 0.88)
        seeds=(0, 1, 2, 3),
        # the two agents-warm seeds (steps3000-draw, the recipe) that passed the warm start
        # check of 7 tried (docs/agents.md, "Warm starts that copy"): 0 and 6. Rerun at
        # 64a4223 (the warm start is deterministic at one commit: two runs, equal losses),
        # seed 0 fails (hard calls copied on 0 of 258): which seed passes changed with the
        # code since the agents-warm runs, and the study keeps both, reported per warm start
        warm_starts=WarmStarts(count=2, seeds=(0, 6)),
        # (the RL cells start from the shared warm starts: the teacher is off in the setting)
        settings=(setting,),
        overrides=("train.threads=1", "train.lr=3e-4"),
        baseline="pipeline",
        doc="docs/grouping-experiment.md",
        tables=(
            Table("arms", "arms", (*AGENT_METRICS[:1], Metric("eval_tool_rate", "tool rate"))),
            Table(
                "paired",
                "paired",
                (
                    Metric("eval_success", "success"),
                    Metric("eval_tool_rate", "tool rate"),
                    Metric("eval_tool_rate_hard", "tool rate (hard)"),
                ),
            ),
            CALCULATOR_SEEDS_TABLE,
        ),
        curve="eval_tool_rate",
        minutes_per_cell=2.5,
    )


AGENTS_489 = _agents_489(
    "agents-489",
    TOOL_PAYS,
    "#489 on calc_openai, reward = correctness, the tool pays: the v0.x + verl pipeline vs"
    " estimators",
)
AGENTS_489_NO_PAY = _agents_489(
    "agents-489-no-pay",
    TOOL_DOES_NOT_PAY,
    "#489 on calc_openai, reward = correctness, the tool never pays on hard problems: the"
    " pipeline vs estimators",
)

CALC_X = "examples/agents/calc_x/calc_x.toml"
CALC_X_WARM_METRICS = (
    # greedy decoding takes the majority of a per-draw mix (60% direct): where it never
    # decides to call, warm_tf_*_call is absent and its share decided otherwise is 1
    Metric("warm_tf_hard_call_other", "hard calls decided otherwise", "first"),
    # ... so the copy is measured with the teacher's decision forced (every seed's run
    # logs it from 1f684f1 on; seeds 0-2 ran again there)
    Metric("warm_tf_hard_call_forced", "hard operands copied (forced)", "first"),
    Metric("warm_tf_easy_call_forced", "easy operands copied (forced)", "first"),
    WARM_METRICS[1],  # hard result exact
    WARM_METRICS[3],  # easy result exact
    Metric("warm_tf_easy_direct", "easy direct exact", "first"),
    *WARM_METRICS[4:],
)

AGENTS_CALC_X_WARM = Study(
    name="agents-calc-x-warm",
    title="calc_x (autogen + MCP) warm starts alone: which seeds copy operands and results",
    config=CALC_X,
    # each cell is the recipe's warm start only (train.steps=0): the teacher's rollouts
    # through the unchanged agent (one MCP server each), SFT, the step-0 greedy
    # evaluation and the teacher-forced check, as agents-warm for calc_openai
    arms=(Arm("recipe", ()),),
    seeds=(0, 1, 2, 3, 4, 5),
    overrides=("train.threads=1", "train.steps=0"),
    doc="docs/agents.md",
    tables=(Table("warm", "arms", CALC_X_WARM_METRICS),),
    minutes_per_cell=40.0,
)

CALC_X_TRAINING = (
    Metric("tool_rate", "sampled tool rate (5 steps)", "last:5"),
    Metric("success", "sampled success (5 steps)", "last:5"),
)
"""The rollouts RL samples (temperature 1), first 5 steps -> last 5 (80 episodes each).
The greedy held-out tool rate stays 0 while a call is less likely than an answer (the
warm start's per-draw mix calls on 40%), so it cannot show a drift either way."""
CALC_X_TRAINING_HARD = Metric("tool_rate_hard", "sampled tool rate, hard (5 steps)", "last:5")

CALC_X_WARM_STARTS = dict(cells_of=AGENTS_CALC_X_WARM, cells_arm="recipe")
"""The RL studies of calc_x start from agents-calc-x-warm's cells (half an hour each)."""

AGENTS_CALC_X_PARITY = Study(
    name="agents-calc-x-parity",
    title="The calc_x agent (autogen + MCP) with the measured recipe, from each warm start",
    config=CALC_X,
    # the recipe's RL (dr_grpo, lr 3e-4) from each seed's warm start of agents-calc-x-warm
    # (seed k from warm start k), cut to fit two cores as agents-calc-x-489: 20 steps
    # (320 episodes), evaluations at steps 0, 10 and 20
    arms=(Arm("dr_grpo", ("label=dr_grpo", "warm_start.teacher=none")),),
    seeds=AGENTS_CALC_X_WARM.seeds,
    warm_starts=WarmStarts(count=1, per_seed=True, **CALC_X_WARM_STARTS),
    overrides=("train.threads=1", "train.steps=20", "train.eval_every=10"),
    doc="docs/agents.md",
    tables=(Table("seeds", "seeds", (*DEMO_METRICS, *CALC_X_TRAINING, CALC_X_TRAINING_HARD)),),
    curve="tool_rate",
    minutes_per_cell=13.0,
)


AGENTS_CALC_X_489 = Study(
    name="agents-calc-x-489",
    title="#489 on the literal calc_x agent (autogen + MCP), reward = correctness, the tool"
    " pays: the pipeline vs grpo_mixed vs node",
    config=CALC_X,
    # the arms on the literal agent: the trained pipeline, grpo_mixed, and the
    # best arm of agents-489 on the warm start that passes (mean end success on ws6:
    # grpo_mixed 0.86, node 0.85, grpo 0.85, pipeline 0.84, turn_group 0.84, dr_grpo
    # 0.81; grpo_mixed is an arm already, so the runner-up, node)
    arms=(PIPELINE_ARM, *(_estimator_arm(arm, arm) for arm in ("grpo_mixed", "node"))),
    seeds=(0, 1, 2, 3, 4),
    # the warm starts of agents-calc-x-warm that pass the check (docs/agents.md)
    warm_starts=WarmStarts(count=1, seeds=(0,), **CALC_X_WARM_STARTS),
    settings=(TOOL_PAYS,),
    # lr 3e-4 for every arm: chosen once, on calc_openai (agents-489). Cut to fit two
    # cores: 20 steps of the recipe's 4 problems x 4 rollouts (320 episodes a run), and
    # evaluations at steps 0, 10 and 20 only. Every rollout starts its own MCP server
    # (about 1-1.5 s of a core each, measured on the warm starts' teacher rollouts), so a
    # cell's 416 rollouts cost more than its updates.
    overrides=("train.threads=1", "train.lr=3e-4", "train.steps=20", "train.eval_every=10"),
    baseline="pipeline",
    doc="docs/grouping-experiment.md",
    tables=(
        Table("arms", "arms", (Metric("eval_success", "success"), *CALC_X_TRAINING)),
        Table(
            "paired",
            "paired",
            (Metric("eval_success", "success"), *CALC_X_TRAINING, CALC_X_TRAINING_HARD),
        ),
        Table("seeds", "seeds", (*DEMO_METRICS, *CALC_X_TRAINING, CALC_X_TRAINING_HARD)),
    ),
    curve="tool_rate",
    minutes_per_cell=13.0,
)

PIPELINE_VS_GRPO_MIXED = (PIPELINE_ARM, _estimator_arm("grpo_mixed", "grpo_mixed"))
"""The two arms the issue names on the costly agents: the trained pipeline and grpo_mixed."""

TOOL_PAYS_HELD_OUT = Setting(
    "tool-pays-held-out", (*TOOL_PAYS.overrides, "warm_start.hold_out_teacher_tasks=true")
)
"""The tool pays, and RL never draws one of the warm start's teacher problems."""

AGENTS_CALC_X_HELD_OUT = Study(
    name="agents-calc-x-held-out",
    title="#489 on calc_x with the warm start's teacher problems held out of RL: the"
    " pipeline vs grpo_mixed",
    config=CALC_X,
    # agents-calc-x-489's pipeline and grpo_mixed arms, warm start, steps and lr, on the
    # 256 training problems the warm start never saw (it memorised its 256 teacher
    # problems' answers, on which a direct answer beat a call); 3 seeds, cut to fit
    arms=PIPELINE_VS_GRPO_MIXED,
    seeds=(0, 1, 2),
    warm_starts=AGENTS_CALC_X_489.warm_starts,
    settings=(TOOL_PAYS_HELD_OUT,),
    overrides=AGENTS_CALC_X_489.overrides,
    baseline="pipeline",
    doc="docs/grouping-experiment.md",
    tables=AGENTS_CALC_X_489.tables,
    curve="tool_rate",
    minutes_per_cell=13.0,
)

SMOL = "examples/agents/calc_openai_smollm2.toml"

AGENTS_SMOL_489 = Study(
    name="agents-smol-489",
    title="#489 on a real model: the calc_openai agent on SmolLM2-135M-Instruct (LoRA),"
    " reward = correctness, the tool pays: the pipeline vs grpo_mixed",
    config=SMOL,
    # the pipeline and the best arm of agents-489 on the warm start that can use the tool
    # (mean end success on ws6: grpo_mixed 0.86)
    arms=PIPELINE_VS_GRPO_MIXED,
    seeds=(0, 1, 2),
    warm_starts=WarmStarts(count=1, seeds=(0,)),
    settings=(TOOL_PAYS,),
    # lr 2e-5 for both arms: the SmolLM2 LoRA recipe's (examples/calculator_smollm2.toml,
    # where 5e-4 collapsed the policy within one step), not tuned here. Cut to fit two
    # cores: 16 steps of 4 problems x 4 rollouts (256 episodes a run), evaluations at
    # steps 0, 8 and 16.
    overrides=("train.threads=1", "train.steps=16", "train.eval_every=8"),
    baseline="pipeline",
    doc="docs/grouping-experiment.md",
    tables=(
        Table(
            "arms",
            "arms",
            (
                Metric("eval_success", "success"),
                Metric("eval_tool_rate", "tool rate"),
                *CALC_X_TRAINING,
            ),
        ),
        Table(
            "paired",
            "paired",
            (
                Metric("eval_success", "success"),
                Metric("eval_tool_rate", "tool rate"),
                *CALC_X_TRAINING,
                CALC_X_TRAINING_HARD,
            ),
        ),
        Table("seeds", "seeds", (*DEMO_METRICS, *CALC_X_TRAINING, CALC_X_TRAINING_HARD)),
    ),
    curve="tool_rate",
    minutes_per_cell=16.0,
)

STUDIES: dict[str, Study] = {
    s.name: s
    for s in (
        DEMO_SEEDS,
        TREE_ROLLOUTS,
        GROUPING_LEARNING,
        SEARCH_AGENT,
        AGENTS_CALC_OPENAI,
        AGENTS_PARITY,
        AGENTS_SOLVER_CHECKER,
        ITERATIVE_GRPO,
        ITERATIVE_PERSONA,
        AGENTS_WARM,
        AGENTS_489,
        AGENTS_489_NO_PAY,
        AGENTS_CALC_X_WARM,
        AGENTS_CALC_X_PARITY,
        AGENTS_CALC_X_489,
        AGENTS_CALC_X_HELD_OUT,
        AGENTS_SMOL_489,
    )
}


@dataclass(frozen=True)
class Measurement:
    """A command that writes doc tables but is not a matrix of training runs (a gradient
    measurement, a benchmark): its tables' markers name it, and it says how to rerun."""

    name: str
    command: str
    doc: str
    tables: tuple[str, ...]
    minutes: float


def _openings(name: str, teacher: str, runs: str) -> Measurement:
    """examples/agents/call_credit.py's table of the rollouts RL trained on (``runs``, a
    glob of run directories) split by opening and by the warm start's ``teacher`` file."""
    return Measurement(
        name,
        f"python examples/agents/call_credit.py --teacher {teacher} {runs}",
        "docs/grouping-experiment.md",
        ("openings",),
        0.5,
    )


MEASUREMENTS: dict[str, Measurement] = {
    m.name: m
    for m in (
        Measurement(
            "grouping-gradient",
            "python examples/grouping/gradient.py --batches 110",
            "docs/grouping-experiment.md",
            ("warm-start", "projection", "contrasts"),
            60.0,
        ),
        Measurement(
            "grouping-adam",
            "python examples/grouping/adam.py --chains 24 --updates 3",
            "docs/grouping-experiment.md",
            ("updates",),
            10.0,
        ),
        Measurement(
            "tree-rollouts-resources",
            "python examples/tree/run.py --summarise --out runs/studies/tree-rollouts/LR",
            "docs/tree-rollouts.md",
            ("lr3e-4", "lr1e-3"),
            0.5,
        ),
        Measurement(
            "bench-tree-tokens",
            "python benchmarks/tree_tokens.py --warm-start 100 --write",
            "docs/tree-rollouts.md",
            ("tokens",),
            10.0,
        ),
        Measurement(
            "bench-update",
            "python benchmarks/update.py --write",
            "docs/tree-training.md",
            ("update", "trl"),
            60.0,
        ),
        Measurement(
            "bench-tree-attention",
            "python benchmarks/tree_attention.py --only calculator,frozenlake,patr --steps 1 "
            "--budgets 1024,2048,1000000 --write",
            "docs/tree-training.md",
            ("attention",),
            10.0,
        ),
        Measurement(
            "smol-long",
            "turnrl train --config examples/calculator_smollm2.toml --run-dir runs/smol-long "
            "--overwrite train.steps=36 train.eval_every=12 train.checkpoint_every=12 "
            "env.n_eval_tasks=32 train.threads=1",
            "docs/tree-training.md",
            ("heldout",),
            40.0,
        ),
        Measurement(
            "bench-agents",
            "python benchmarks/agents.py",
            "docs/agents.md",
            ("gateway",),
            5.0,
        ),
        _openings(
            "agents-calc-x-credit",
            "runs/studies/agents-calc-x-warm/recipe/seed0/rollouts/teacher.jsonl",
            "runs/studies/agents-calc-x-489/tool-pays/*/ws0-seed*",
        ),
        _openings(
            "agents-calc-x-held-out-credit",
            "runs/studies/agents-calc-x-warm/recipe/seed0/rollouts/teacher.jsonl",
            "runs/studies/agents-calc-x-held-out/tool-pays-held-out/*/ws0-seed*",
        ),
        _openings(
            "agents-smol-credit",
            "runs/studies/agents-smol-489/warm/ws0/rollouts/teacher.jsonl",
            "runs/studies/agents-smol-489/tool-pays/*/ws0-seed*",
        ),
        Measurement(
            "bench-sampling",
            "make bench-sampling",
            "docs/backends.md",
            ("throughput", "step", "agents"),
            60.0,
        ),
        Measurement(
            "bench-mismatch",
            ".venv/bin/python benchmarks/mismatch.py --backend hf; "
            ".venv-vllm/bin/python benchmarks/mismatch.py --backend vllm",
            "docs/backends.md",
            ("mismatch",),
            5.0,
        ),
        Measurement(
            "iterative-persona-following",
            "python examples/iterative_grpo/persona_following.py haggle split_money "
            "--warm-starts runs/studies/iterative-persona/warm",
            "docs/iterative-grpo.md",
            ("persona",),
            5.0,
        ),
    )
}


def get_study(name: str) -> Study:
    if name in MEASUREMENTS:
        raise UsageError(
            f"{name!r} is a measurement, not a matrix of runs: its command is "
            f"`{MEASUREMENTS[name].command}`"
        )
    if name not in STUDIES:
        raise UsageError(f"unknown study {name!r}; declared: {', '.join(STUDIES)}")
    return STUDIES[name]


def known_tables() -> dict[str, tuple[str, ...]]:
    """Marker name -> table names, for every study and measurement."""
    out = {name: study.table_names for name, study in STUDIES.items()}
    out.update({name: m.tables for name, m in MEASUREMENTS.items()})
    return out
