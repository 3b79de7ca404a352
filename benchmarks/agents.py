"""Agent throughput through the gateway: batching concurrent calls against ``--max-batch 1``.

The openai-client calculator agent (``examples/agents/calc_openai.py``, in-process,
one thread per agent) runs ``--agents`` at a time against an in-process gateway on
a loopback port. Both arms serve the same warm-started tiny policy in the same
process, alternating (A B A B ...), and report agent episodes per second; the
gateway's batching counters say how many calls shared a ``policy.sample`` call.

    .venv/bin/python benchmarks/agents.py            # writes the section in RESULTS.md
    .venv/bin/python benchmarks/agents.py --no-write

The policy is warm-started first (SFT on the agent's own calls against the scripted
teacher of ``examples/agents/calc_teacher.py``), so that episodes look like
training ones: a tool call then an answer on half of the hard problems, an answer
otherwise, replies that end with the end-of-turn token.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results_file import write_section  # noqa: E402

from turnrl.policy import HFPolicy, build_tiny_policy  # noqa: E402
from turnrl.serve import Gateway, GatewayConfig, GatewayServer  # noqa: E402
from turnrl.train.agent.programs import make_program  # noqa: E402
from turnrl.train.agent.runner import AgentRunner, GatewayLink  # noqa: E402
from turnrl.train.agent.tasks import calculator_task_set  # noqa: E402
from turnrl.train.agent.teacher import TeacherGateway, load_teacher, teacher_examples  # noqa: E402
from turnrl.train.update.sft import supervised_warm_start  # noqa: E402

AGENT = f"{ROOT / 'examples' / 'agents' / 'calc_openai.py'}:run"
TEACHER = f"{ROOT / 'examples' / 'agents' / 'calc_teacher.py'}:teach"
MAX_TOKENS = 24


def warm_policy(steps: int, n_tasks: int, initial: HFPolicy | None = None):
    """The tiny policy (``initial``, default the built-in one of seed 0) after SFT on the
    agent's calls against the teacher."""
    policy = build_tiny_policy(0) if initial is None else initial
    tasks = calculator_task_set(n_tasks, seed=0)
    jobs = [(f"w-{i}", task) for i, task in enumerate(tasks)]
    by_rollout = {rid: dict(task.payload) for rid, task in jobs}
    config = GatewayConfig(default_max_tokens=MAX_TOKENS)
    with (
        TeacherGateway(policy, load_teacher(TEACHER), by_rollout, config) as gateway,
        GatewayServer(gateway) as server,
    ):
        runner = AgentRunner(
            make_program(AGENT, None),
            GatewayLink(gateway, server),
            concurrency=8,
            timeout_s=600,
            model="agent",
        )
        results = runner.run(jobs)
    records = [r for result in results for r in result.records]
    supervised_warm_start(
        policy, teacher_examples(records), steps=steps, lr=3e-3, batch_size=32, seed=0
    )
    return policy


def measure(policy, tasks, agents: int, max_batch: int, window_ms: float) -> dict[str, float]:
    """Episodes per second of ``tasks`` (one episode each), ``agents`` at a time."""
    config = GatewayConfig(
        default_max_tokens=MAX_TOKENS, max_batch=max_batch, batch_window_s=window_ms / 1000
    )
    with Gateway(policy, config) as gateway, GatewayServer(gateway) as server:
        runner = AgentRunner(
            make_program(AGENT, None),
            GatewayLink(gateway, server),
            concurrency=agents,
            timeout_s=600,
            model="agent",
        )
        started = time.perf_counter()
        results = runner.run([(f"b-{i}", task) for i, task in enumerate(tasks)])
        seconds = time.perf_counter() - started
        batching = gateway.served.batch_stats()
    failures = sum(r.failure is not None for r in results)
    if failures:
        raise RuntimeError(f"{failures} agent runs failed in the benchmark")
    return {
        "seconds": seconds,
        "episodes_per_s": len(results) / seconds,
        "calls": sum(len(r.records) for r in results),
        "completion_tokens": sum(len(t.response_ids or ()) for r in results for t in r.records),
        "prompt_tokens": sum(len(t.prompt_ids or ()) for r in results for t in r.records),
        "mean_batch": batching["requests"] / max(batching["calls"], 1),
        "largest": batching["largest"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=16, help="concurrent agents")
    parser.add_argument("--episodes", type=int, default=128, help="episodes per measurement")
    parser.add_argument("--repeats", type=int, default=2, help="measurements per arm (ABAB)")
    parser.add_argument("--warm-steps", type=int, default=200)
    parser.add_argument(
        "--policy",
        help="a saved policy directory (e.g. a run's warm_start/) instead of warm-starting here",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.policy:
        policy = HFPolicy.from_pretrained(args.policy)
        source = f"the saved policy {args.policy}"
    else:
        policy = warm_policy(args.warm_steps, n_tasks=256)
        source = f"tiny policy after {args.warm_steps} warm-start steps on teacher calls"
    tasks = calculator_task_set(args.episodes, seed=123)
    arms = {
        "max_batch 1 (no batching)": (1, 5.0),
        "batching, 5 ms window (turnrl serve default)": (64, 5.0),
        "batching, 50 ms window (agent loop default)": (64, 50.0),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    for _ in range(args.repeats):
        for name, (max_batch, window_ms) in arms.items():
            runs[name].append(measure(policy, tasks, args.agents, max_batch, window_ms))
    rows = {
        name: {k: statistics.mean(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()
    }
    base = rows["max_batch 1 (no batching)"]["episodes_per_s"]
    lines = [
        f"{args.episodes} calculator episodes (openai-client agent, in-process threads), "
        f"{args.agents} agents at a time, {source}, "
        f"{MAX_TOKENS} new tokens at most, {args.threads} torch thread(s); "
        f"mean of {args.repeats} alternating measurements per arm.",
        "",
        "| gateway | episodes/s | calls per episode | mean batch | largest batch | speed-up |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['episodes_per_s']:.2f} | {row['calls'] / args.episodes:.2f} | "
            f"{row['mean_batch']:.1f} | {row['largest']:.0f} | "
            f"{row['episodes_per_s'] / base:.1f}x |"
        )
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        arguments = " ".join(sys.argv[1:])
        command = (
            f".venv/bin/python benchmarks/agents.py {arguments}"
            if arguments
            else "make bench-agents  # .venv/bin/python benchmarks/agents.py"
        )
        write_section(
            ROOT / "benchmarks" / "RESULTS.md",
            "Agent throughput through the gateway",
            body,
            command,
            date.today(),
        )


if __name__ == "__main__":
    main()
