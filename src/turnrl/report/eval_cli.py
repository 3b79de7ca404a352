"""``turnrl eval``: a saved policy on held-out tasks, with the numbers a run logs and more.

Registered in the top-level CLI through :func:`add_eval_command`. The evaluation is
the trainers' own (:mod:`turnrl.train.evaluate`): the built-in environment's episodes,
or the unchanged agent program (``[agent]``) through a gateway serving the policy; so
on a run's last checkpoint and the config's held-out tasks it reproduces the run's last
``eval_*`` row exactly (``tests/test_eval_cli.py``; docs/eval.md). On top of those
metrics it reports pass@k, success by route and by task kind, turns and tokens per
episode (:mod:`turnrl.train.eval_summary`), and writes into ``-o DIR``::

    summary.json    the metrics (``eval_*``, as a run logs them), the breakdown, the inputs
    tasks.jsonl     one line per task: samples, successes, pass@k, every sample's outcome
    records.jsonl   every evaluated turn's record (exact tokens)
    eval.md         the breakdown as a markdown table
    eval.html       the breakdown and the metrics in the run report's style

Everything checkable (the config, the task file, the agent program, the policy
directory, the output directory) is checked before the policy is sampled; bad input is
one line naming the file, line and field, exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from turnrl.errors import UsageError

__all__ = ["add_eval_command", "cmd_eval"]

RUN_CONFIG = "config.toml"
"""The config copy a run directory holds (``--config``'s default for one)."""

PIPE_WIDTH = 160
"""The table's width when stdout is not a terminal (a log file: rich would assume 80)."""

BACKENDS = ("hf", "vllm")
"""``--backend`` values: transformers in this process, or an in-process vLLM engine."""


def add_eval_command(subparsers: Any) -> None:
    """Add ``turnrl eval`` to the top-level parser's subcommands."""
    p = subparsers.add_parser(
        "eval",
        help="evaluate a saved policy (a run's last checkpoint or a model directory)",
        description="Evaluate a saved policy on held-out tasks: the numbers a training run "
        "logs, pass@k, success by route and by task kind, turns and tokens (docs/eval.md).",
    )
    p.add_argument(
        "--policy",
        required=True,
        metavar="DIR|RUN_DIR",
        help="a run directory (its last checkpoint) or a model directory (config.json or "
        "adapter_config.json: turnrl export's output, a warm_start/)",
    )
    p.add_argument(
        "--config",
        help=f"the run's TOML config (default: RUN_DIR/{RUN_CONFIG} for a run directory)",
    )
    p.add_argument("overrides", nargs="*", metavar="SECTION.FIELD=VALUE", help="config overrides")
    p.add_argument(
        "--tasks",
        metavar="FILE",
        help="JSONL or Parquet task file (default: the config's held-out tasks)",
    )
    p.add_argument(
        "--samples",
        type=_positive,
        metavar="K",
        help="episodes per task (default: train.eval_samples); pass@k for k up to K",
    )
    p.add_argument(
        "--temperature",
        type=float,
        metavar="T",
        help="sampling temperature (default: train.eval_temperature; 0 is greedy)",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        help="what samples: transformers (hf) or vLLM (default: policy.backend)",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="OUT_DIR",
        help="output directory (default: RUN_DIR/eval, or ./eval for a model directory)",
    )
    p.add_argument("--quiet", action="store_true", help="print only where the outputs are")
    p.set_defaults(handler=cmd_eval)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _load_config(args: argparse.Namespace) -> tuple[Any, str]:
    """The validated run config and the file it came from."""
    from turnrl.config_toml import load_config
    from turnrl.train.config import RunConfig
    from turnrl.train.validate import validate

    path = args.config
    if path is None:
        path = str(Path(args.policy) / RUN_CONFIG)
        if not Path(path).is_file():
            raise UsageError(f"--config: {args.policy} holds no {RUN_CONFIG}; name the config")
    overrides = list(args.overrides)
    if args.backend is not None:  # checked as the config field (installed, supported)
        overrides.append(f"policy.backend={args.backend}")
    config = load_config(RunConfig, path, overrides)
    validate(config, toml_path=path, overrides=overrides)
    if args.temperature is not None and args.temperature < 0:
        raise UsageError(f"--temperature: must be at least 0, got {args.temperature}")
    return config, path


def _output_dir(args: argparse.Namespace) -> Path:
    """``-o``, or its default; created, and refused when it is not a directory."""
    from turnrl.train.run import WARM_START_DIR

    if args.output is not None:
        out = Path(args.output)
    elif (Path(args.policy) / WARM_START_DIR).is_dir():
        out = Path(args.policy) / "eval"
    else:
        out = Path("eval")
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o/--output: {out} exists and is not a directory")
    return out


def _env_tasks(config: Any, tasks_file: str | None) -> tuple[list[Any], float]:
    """The environment's tasks to evaluate on and the share unseen in training."""
    from turnrl.envs import make_tasks
    from turnrl.train.eval_tasks import env_tasks, read_tasks
    from turnrl.train.task_split import TaskSplit, task_split

    split = task_split(config.env)
    if tasks_file is None:
        return split.eval, split.eval_unseen
    env = config.env
    example = make_tasks(env.name, 1, env.seed, **env.task_kwargs)[0]
    tasks = env_tasks(*read_tasks(tasks_file), env.name, example)
    return tasks, TaskSplit(split.train, tasks).eval_unseen


def cmd_eval(args: argparse.Namespace) -> int:
    """Run ``turnrl eval`` (see the module docstring)."""
    from rich.console import Console

    from turnrl.policy.factory import build_sampler, close_sampler
    from turnrl.report.eval_tables import console_table
    from turnrl.train.lifecycle import seed_process
    from turnrl.train.saved_policy import load_saved_policy

    config, config_path = _load_config(args)
    out = _output_dir(args)
    samples = args.samples or config.train.eval_samples
    temperature = (
        config.train.eval_temperature if args.temperature is None else float(args.temperature)
    )
    settings = config.policy
    # rows of the largest sampling call (a vLLM engine's size), as the trainers size it
    if config.agent.enabled:
        run = _agent_evaluation(config, args.tasks, out)
        unseen, rows = None, config.agent.max_batch
    else:
        tasks, unseen = _env_tasks(config, args.tasks)
        run = _env_evaluation(config, tasks)
        rollout = config.rollout
        rows = max(rollout.tasks_per_step * rollout.group_size, len(tasks) * samples)
    seed_process(config.train.seed, config.train.threads)
    saved = load_saved_policy(args.policy, settings)
    saved.policy.model.eval()
    sampler = build_sampler(settings, saved.policy, rows=rows)
    try:
        evaluation = run(sampler, samples=samples, temperature=temperature)
    finally:
        close_sampler(saved.policy, sampler)
    metrics = dict(evaluation.metrics)
    if unseen is not None:
        metrics["eval_unseen"] = unseen
    title = f"turnrl eval: {saved.source}"
    notes = [
        f"config {config_path}; tasks {args.tasks or 'the config held-out tasks'}; "
        f"{samples} sample(s) per task at temperature {temperature:g}; "
        f"backend {settings.backend}"
    ]
    if samples > 1 and temperature == 0:
        notes.append("greedy decoding: the samples of a task are the same, pass@k = pass@1")
    breakdown = _write_outputs(out, evaluation, metrics, samples, title, notes)
    summary = {
        "policy": saved.source,
        "step": saved.step,
        "config": config_path,
        "tasks": args.tasks,
        "samples": samples,
        "temperature": temperature,
        "backend": settings.backend,
        "agent_failures": evaluation.failures,
        "metrics": metrics,
        "breakdown": breakdown,
    }
    from turnrl.io import atomic_write_json

    atomic_write_json(out / "summary.json", summary)
    console = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)  # logs: not squeezed
    if not args.quiet:
        console.print(console_table(breakdown, title))
        for note in notes[1:]:
            console.print(note)
    console.print(f"eval: {out}/ (summary.json, tasks.jsonl, records.jsonl, eval.md, eval.html)")
    return 0


def _env_evaluation(config: Any, tasks: list[Any]) -> Any:
    """What evaluates a sampler on the environment's ``tasks``."""
    from turnrl.envs import make_env
    from turnrl.train.evaluate import evaluate_in_env

    env = config.env

    def run(sampler: Any, *, samples: int, temperature: float) -> Any:
        return evaluate_in_env(
            sampler,
            lambda: make_env(env.name, **env.env_kwargs),
            tasks,
            samples=samples,
            temperature=temperature,
            max_new_tokens=config.policy.max_new_tokens,
            max_context_tokens=config.rollout.max_context_tokens,
        )

    return run


def _agent_evaluation(config: Any, tasks_file: str | None, out: Path) -> Any:
    """What evaluates a sampler with the config's agent program through a gateway (the
    program and the tasks are checked here, before any policy is loaded)."""
    from turnrl.serve import bind_socket
    from turnrl.train.agent.programs import make_program
    from turnrl.train.agent.serving import HOST, serve_agents
    from turnrl.train.eval_tasks import agent_eval_tasks, read_tasks
    from turnrl.train.evaluate import evaluate_agents

    agent = config.agent
    program = make_program(
        agent.entrypoint, agent.command or None, agent.env, isolation=agent.isolation
    )
    tasks = agent_eval_tasks(config.tasks) if tasks_file is None else read_tasks(tasks_file)[0]

    def run(sampler: Any, *, samples: int, temperature: float) -> Any:
        with contextlib.ExitStack() as servers:
            served = serve_agents(
                servers,
                sampler,
                program,
                config,
                temperature=temperature,
                sock=bind_socket(HOST, 0),
                version=0,
            )
            return evaluate_agents(
                served.runner,
                tasks,
                samples=samples,
                prefix="e-",
                failure_dir=out / "agent_failures",
            )

    return run


def _write_outputs(
    out: Path,
    evaluation: Any,
    metrics: dict[str, float],
    samples: int,
    title: str,
    notes: list[str],
) -> dict[str, dict[str, Any]]:
    """Write the per-task JSONL, the records, the markdown and HTML tables; the breakdown."""
    from turnrl.io import atomic_write_text
    from turnrl.records import dumps_record
    from turnrl.report.eval_tables import html_report, markdown_table
    from turnrl.train.eval_summary import breakdown, episode_outcomes, pass_ks, task_rows

    out.mkdir(parents=True, exist_ok=True)
    outcomes = episode_outcomes(evaluation)
    ks = pass_ks(samples)
    table = breakdown(outcomes, ks)
    rows = task_rows(outcomes, ks)
    atomic_write_text(out / "tasks.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    atomic_write_text(
        out / "records.jsonl", "".join(dumps_record(r) + "\n" for r in evaluation.records)
    )
    header = "".join(f"{note}\n\n" for note in notes)
    atomic_write_text(out / "eval.md", f"# {title}\n\n{header}{markdown_table(table)}")
    atomic_write_text(out / "eval.html", html_report(table, metrics, title=title, notes=notes))
    return table
