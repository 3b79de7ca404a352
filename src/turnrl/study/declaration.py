"""What a study is: a declared matrix of runs, and the cells it expands to.

A study is arms x seeds x warm starts x settings of one command (``turnrl train``
by default, ``turnrl iterate`` or a script that accepts the same shape of
arguments). Every cell is the command, the study's config and the overrides of its
setting, arm, seed and warm start, and a run directory of its own::

    runs/studies/<study>/[<setting>/]<arm>/[ws<w>-]seed<k>

Warm starts are a level of the matrix: with ``WarmStarts`` declared, warm start
``w`` is a run of its own (``train.steps=0`` and ``train.seed=w`` by default)
under ``runs/studies/<study>/warm/ws<w>``, and every cell of warm start ``w``
starts from it (``warm_start.init_from=...``). Without it, each cell trains its own
warm start inside its run (seeded by the cell's seed). A study may instead start from
another study's cells (``WarmStarts.cells_of``): warm start ``w`` is then that study's
run of seed ``w``, in that study's directory and with its command, so studies of one
costly warm start (the autogen + MCP agent's: half an hour) share one run of it.

Nothing here runs anything; :mod:`turnrl.study.runner` does.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

TRAIN = ("{python}", "-m", "turnrl.cli", "train", "--quiet")
ITERATE = ("{python}", "-m", "turnrl.cli", "iterate", "--quiet")
STUDIES_DIR = Path("runs") / "studies"
DONE_FILE = "study-cell.json"
"""Written into a cell's run directory when its command exited 0 (command, seconds, date)."""


@dataclass(frozen=True)
class Arm:
    """One treatment: a name (a table row) and the overrides that make it."""

    name: str
    overrides: tuple[str, ...] = ()
    config: str | None = None
    """The arm's own recipe (relative to the repository root); default: the study's."""
    program: tuple[str, ...] | None = None
    """The arm's own command (e.g. ``turnrl train`` in a study of ``turnrl iterate``
    runs); default: the study's."""
    seed_override: str | None = None
    """How the arm's command takes the seed; default: the study's."""


@dataclass(frozen=True)
class Setting:
    """One setting of the environment or budget, crossed with every arm."""

    name: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class WarmStarts:
    """Shared warm starts as a level of the matrix (see the module docstring)."""

    count: int
    """How many; with ``per_seed`` it is ignored (one per seed)."""
    seeds: tuple[int, ...] = ()
    """The warm starts' own seeds, when not ``0 .. count-1``: warm start ``w`` is the run
    with ``train.seed=w`` under ``ws<w>``. For a recipe whose warm start fails its check
    on some seeds, the study names the seeds that pass (and its doc the ones that did
    not). ``count`` must equal their number."""
    per_seed: bool = False
    """One warm start per seed, warm start ``k`` for seed ``k`` (the seed is both)."""
    program: tuple[str, ...] | None = None
    """The warm-start command; default: the study's."""
    overrides: tuple[str, ...] = ("train.steps=0",)
    """Overrides of the warm-start run (added to the study's own)."""
    seed_override: str = "train.seed={warm}"
    init_override: str = "warm_start.init_from={warm_dir}/warm_start"
    per_setting: bool = False
    """One warm start per setting as well (with the setting's overrides), under
    ``warm/<setting>/ws<w>``: for settings that change the environment."""
    cells_of: Study | None = None
    """Another study whose cells are these warm starts: warm start ``w`` is its cell of
    arm ``cells_arm`` and seed ``w`` (run there, with its command, when it is missing).
    ``program``, ``overrides`` and the seed override are then that study's."""
    cells_arm: str = ""

    def __post_init__(self) -> None:
        if self.seeds and not len(self.seeds) == len(set(self.seeds)) == self.count:
            raise ValueError(
                f"WarmStarts: seeds {self.seeds} must be {self.count} distinct seeds (count)"
            )
        if self.seeds and self.per_seed:
            raise ValueError("WarmStarts: seeds and per_seed exclude each other")
        if self.cells_of is not None:
            if self.per_setting:
                raise ValueError("WarmStarts: cells_of and per_setting exclude each other")
            if self.cells_arm not in {arm.name for arm in self.cells_of.arms}:
                raise ValueError(
                    f"WarmStarts: cells_arm {self.cells_arm!r} is not an arm of study "
                    f"{self.cells_of.name!r}"
                )


@dataclass(frozen=True)
class Metric:
    """A number a table reports: ``key`` in the cell's ``metrics.jsonl``.

    ``reduce``: ``"last"`` (the last row that has it; the end of the run),
    ``"first"`` (the first such row; the start), ``"min_after_first"`` (the lowest
    after the first), ``"mean_after_first"`` (the mean over rows after the first),
    ``"mean"`` (the mean over every row that has it: with one row per equal-sized batch,
    the mean over the whole run), ``"last:N"`` / ``"first:N"`` (the mean of the last /
    first N rows: a training-step rate over few episodes, smoothed; a table's start of
    ``"last:N"`` is ``"first:N"``)."""

    key: str
    label: str
    reduce: str = "last"
    digits: int = 2


@dataclass(frozen=True)
class Table:
    """A table the summary writes (into ``summary.md`` and between the doc's markers).

    ``kind``: ``"seeds"`` (one row per cell: start -> end of each metric, then the
    ``extra`` metrics), ``"arms"`` (per arm and setting: end mean +- sd, change, end
    per seed) or ``"paired"`` (per arm and setting: ``arm - baseline`` of the end
    value per pair, mean, bootstrap CI, verdict)."""

    name: str
    kind: str
    metrics: tuple[Metric, ...]
    extra: tuple[Metric, ...] = ()
    arms: tuple[str, ...] = ()
    """The arms the table shows (all when empty)."""
    baseline: str | None = None
    """A paired table's baseline arm; default: the study's."""


@dataclass(frozen=True)
class Cell:
    """One run of a study."""

    study: str
    setting: str
    arm: str
    warm: int
    seed: int
    run_dir: Path
    argv: tuple[str, ...]
    """The command, without a resume flag (the runner adds one to continue a run)."""
    is_warm_start: bool = False
    warm_from: str = ""
    """The key of the warm-start cell this cell starts from (empty: none)."""

    @property
    def key(self) -> str:
        """The run directory relative to the study's directory: unique in the study."""
        return "/".join(self.run_dir.parts[-(3 if self.setting else 2) :])


@dataclass(frozen=True)
class Study:
    """A declared matrix of runs and the tables and figures summarised from it."""

    name: str
    title: str
    config: str
    """The recipe (TOML), relative to the repository root."""
    arms: tuple[Arm, ...]
    seeds: tuple[int, ...]
    tables: tuple[Table, ...]
    doc: str | None = None
    """The document whose ``<!-- study:NAME:TABLE -->`` markers the summary fills."""
    program: tuple[str, ...] = TRAIN
    overrides: tuple[str, ...] = ()
    settings: tuple[Setting, ...] = (Setting(""),)
    warm_starts: WarmStarts | None = None
    seed_override: str = "train.seed={seed}"
    resume_flag: str | None = "--resume"
    baseline: str | None = None
    """The arm every other arm is compared with, pair by pair."""
    outcome: str = ""
    """The pre-registered outcome: the key of a metric of the study's first paired table
    (default: that table's first metric). ``turnrl study power`` gives its minimum
    detectable effect from a pilot's variance before the study runs."""
    pilot: str = ""
    """The study whose archived cells are the pilot (default: this study's own)."""
    curve: str | None = None
    """A metric plotted per arm against ``curve_x`` (per-seed lines and the mean)."""
    curve_x: str = "step"
    minutes_per_cell: float = 5.0
    """Estimated minutes of one cell on one core here, until one has been measured."""
    regenerated: str = ""
    """Empty when the doc's tables come from this declaration; otherwise the line the
    summary leaves under them (which old command and commit produced them)."""
    notes: str = ""
    doc_tables: tuple[str, ...] = field(default=())
    """Marker names of doc tables kept from an older command (not written by this
    summary; see ``regenerated``)."""

    def __post_init__(self) -> None:
        names = [arm.name for arm in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"study {self.name!r}: two arms share a name")
        for baseline in (self.baseline, *(table.baseline for table in self.tables)):
            if baseline is not None and baseline not in names:
                raise ValueError(f"study {self.name!r}: baseline {baseline!r} is not an arm")
        for table in self.tables:
            if set(table.arms) - set(names):
                raise ValueError(f"study {self.name!r}, table {table.name!r}: unknown arms")

    @property
    def table_names(self) -> tuple[str, ...]:
        return tuple(table.name for table in self.tables) + self.doc_tables


def study_dir(study: Study, root: Path) -> Path:
    return root / STUDIES_DIR / study.name


def _fill(template: str, **values: object) -> str:
    return template.format(**values)


def warm_indices(study: Study) -> list[int]:
    """The warm starts' seeds (``ws<w>`` is the run with ``train.seed=w``)."""
    if study.warm_starts is None:
        return [0]
    if study.warm_starts.per_seed:
        return list(study.seeds)
    return list(study.warm_starts.seeds or range(study.warm_starts.count))


def _warm_settings(study: Study) -> tuple[Setting, ...]:
    """The settings that have warm starts of their own (one unnamed one otherwise)."""
    per_setting = study.warm_starts is not None and study.warm_starts.per_setting
    return study.settings if per_setting else (Setting(""),)


def warm_dir(study: Study, root: Path, setting: Setting, warm: int) -> Path:
    """The run directory of warm start ``warm`` (of ``setting`` if warm starts are per
    setting)."""
    parent = study_dir(study, root) / "warm"
    if study.warm_starts is not None and study.warm_starts.per_setting:
        parent = parent / setting.name
    return parent / f"ws{warm}"


def warm_cells(study: Study, root: Path) -> list[Cell]:
    """The shared warm-start runs (none unless ``warm_starts`` is declared)."""
    if study.warm_starts is None:
        return []
    if study.warm_starts.cells_of is not None:
        source_cells = cells(study.warm_starts.cells_of, root)  # expanded once, not per warm
        return [_cell_of(study, source_cells, warm) for warm in warm_indices(study)]
    out = []
    program = study.warm_starts.program or study.program
    for setting in _warm_settings(study):
        for warm in warm_indices(study):
            run_dir = warm_dir(study, root, setting, warm)
            argv = (
                *(_fill(part, python=sys.executable) for part in program),
                "--config",
                str(root / study.config),
                *study.overrides,
                *setting.overrides,
                *study.warm_starts.overrides,
                _fill(study.warm_starts.seed_override, warm=warm),
                f"run_dir={run_dir}",
            )
            cell = Cell(study.name, setting.name, "warm", warm, warm, run_dir, argv, True)
            out.append(cell)
    return out


def _cell_of(study: Study, source_cells: list[Cell], warm: int) -> Cell:
    """Warm start ``warm`` as the cell of ``study.warm_starts.cells_of`` (whose cells are
    ``source_cells``) that is it."""
    warm_starts = study.warm_starts
    assert warm_starts is not None and warm_starts.cells_of is not None
    source = warm_starts.cells_of
    for cell in source_cells:
        if not cell.is_warm_start and cell.arm == warm_starts.cells_arm and cell.seed == warm:
            return replace(cell, study=study.name, warm=warm, is_warm_start=True, warm_from="")
    raise ValueError(
        f"study {study.name!r}: warm start {warm} is not a cell of study {source.name!r} "
        f"(arm {warm_starts.cells_arm!r}, seeds {source.seeds})"
    )


def cells(study: Study, root: Path) -> list[Cell]:
    """Every cell of the study: warm starts first, then settings x warm starts x seeds
    x arms (so a study cut short has whole pairs of the first seeds)."""
    out = warm_cells(study, root)
    shared_setting = study.warm_starts is None or not study.warm_starts.per_setting
    warm_by = {("" if shared_setting else c.setting, c.warm): c for c in out}
    per_seed = study.warm_starts is not None and study.warm_starts.per_seed
    base = study_dir(study, root)
    for setting in study.settings:
        for warm in warm_indices(study):
            for seed in [warm] if per_seed else study.seeds:
                for arm in study.arms:
                    parent = base / setting.name if setting.name else base
                    shared = study.warm_starts is not None and not per_seed
                    leaf = f"ws{warm}-seed{seed}" if shared else f"seed{seed}"
                    run_dir = parent / arm.name / leaf
                    warm_override: tuple[str, ...] = ()
                    warm_from = ""
                    if study.warm_starts:
                        start = warm_by["" if shared_setting else setting.name, warm]
                        init = _fill(study.warm_starts.init_override, warm_dir=start.run_dir)
                        warm_override = (init,)
                        warm_from = start.key
                    seed_override = arm.seed_override or study.seed_override
                    argv = (
                        *(
                            _fill(part, python=sys.executable)
                            for part in arm.program or study.program
                        ),
                        "--config",
                        str(root / (arm.config or study.config)),
                        *study.overrides,
                        *setting.overrides,
                        *arm.overrides,
                        *warm_override,
                        _fill(seed_override, seed=seed),
                        f"run_dir={run_dir}",
                    )
                    out.append(
                        Cell(
                            study.name,
                            setting.name,
                            arm.name,
                            warm,
                            seed,
                            run_dir,
                            argv,
                            warm_from=warm_from,
                        )
                    )
    return out
