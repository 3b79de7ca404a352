"""Gateway memory under huge requests: peak RSS of ``turnrl serve`` as a ratio to idle.

Issue 15 found one 15 MB chat request (under the 16 MiB body cap) costing 38 s
and 3.5 GB before its 400, and two at once peaking at 9.5 GB with 6.6 GB held
afterwards: the whole text was tokenised before the context limit was checked.
The gateway now refuses a request whose text cannot fit the context (more than
16 characters per context position, or more messages than positions) right
after parsing the JSON, so the cost of such a request is bounded by the body
cap, not by the tokenizer.

Method: start ``turnrl serve --policy tiny`` as a child process, send one small
request (so lazy imports and the first sample are done), read its RSS (the idle
baseline), reset the kernel's peak-RSS counter (``/proc/PID/clear_refs``), send
``--concurrent`` requests of ``--megabytes`` MB of text at once, and read the
peak (``VmHWM``) and the RSS afterwards. Rounds repeat this to show that memory
is not held or accumulated. ``--contrast-megabytes N`` also measures a server
with the bound switched off on bodies of N MB (the old behaviour; keep N small,
it costs gigabytes).

Stated figure (checked here, written to RESULTS.md): the peak stays under
``PEAK_RATIO_TARGET`` x the idle RSS, and after the requests RSS is back under
``HELD_RATIO_TARGET`` x idle.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from datetime import date
from pathlib import Path
from typing import Any

from results_file import write_section

from turnrl.serve.limits import (
    BODY_SLACK_BYTES,
    CHARS_PER_TOKEN_BOUND,
    JSON_BYTES_PER_CHAR,
    MESSAGE_OVERHEAD_BYTES,
)

PEAK_RATIO_TARGET = 1.25
HELD_RATIO_TARGET = 1.15


def _kib(pid: int, field: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    if match is None:
        raise RuntimeError(f"no {field} in /proc/{pid}/status")
    return int(match.group(1))


API_KEY = secrets.token_urlsafe(32)
"""The key the benchmark's server is started with (``TURNRL_API_KEY``)."""


def _post(port: int, path: str, body: bytes, timeout: float = 600) -> tuple[int, dict, float]:
    start = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        payload = json.loads(response.read())
    finally:
        connection.close()
    return response.status, payload, time.perf_counter() - start


def _start_server(extra: list[str]) -> tuple[subprocess.Popen[str], int]:
    command = [sys.executable, "-m", "turnrl.cli", "serve", "--policy", "tiny", "--port", "0"]
    command += ["--log-level", "warning", *extra]
    env = {**os.environ, "TURNRL_API_KEY": API_KEY}
    child = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    assert child.stderr is not None
    line = child.stderr.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    if match is None:
        child.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    # Keep draining stderr so the child never blocks on a full pipe.
    threading.Thread(target=child.stderr.read, daemon=True).start()
    return child, int(match.group(1))


def _round(pid: int, port: int, body: bytes, concurrent: int) -> dict[str, float]:
    """Send ``concurrent`` copies of ``body`` at once; peak and after RSS in MiB."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    results: list[tuple[int, dict, float]] = []
    threads = [
        threading.Thread(
            target=lambda i=i: results.append(
                _post(port, f"/rollouts/huge-{time.time_ns()}-{i}/v1/chat/completions", body)
            )
        )
        for i in range(concurrent)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = sorted({status for status, _, _ in results})
    time.sleep(0.5)
    return {
        "statuses": statuses,
        "message": results[0][1].get("error", {}).get("message", ""),
        "seconds": max(seconds for _, _, seconds in results),
        "peak": _kib(pid, "VmHWM") / 1024,
        "after": _kib(pid, "VmRSS") / 1024,
    }


def _body(characters: int) -> bytes:
    text = "x" * characters
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()


def _measure(
    extra: list[str], loads: dict[str, bytes], concurrent: int, rounds: int
) -> tuple[float, dict[str, list[dict[str, Any]]]]:
    """Idle RSS (MiB) of a fresh server and the rounds of each load against it."""
    child, port = _start_server(extra)
    try:
        small = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        status, _, _ = _post(port, "/rollouts/warm/v1/chat/completions", small.encode())
        assert status == 200, status
        time.sleep(0.5)
        idle = _kib(child.pid, "VmRSS") / 1024
        results = {
            name: [_round(child.pid, port, body, concurrent) for _ in range(rounds)]
            for name, body in loads.items()
        }
    finally:
        child.kill()
        child.wait(30)
    return idle, results


def _table(
    idle: float, results: dict[str, list[dict[str, Any]]], sizes: dict[str, int]
) -> list[str]:
    lines = [
        "| body | round | answer | slowest answer | peak RSS | peak / idle | RSS after | "
        "after / idle |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for name, rounds in results.items():
        for i, r in enumerate(rounds, 1):
            answers = ", ".join(str(s) for s in r["statuses"])
            lines.append(
                f"| {name} ({sizes[name] / 2**20:.1f} MiB) | {i} | {answers} | "
                f"{r['seconds']:.2f} s | {r['peak']:.0f} MiB | {r['peak'] / idle:.2f}x | "
                f"{r['after']:.0f} MiB | {r['after'] / idle:.2f}x |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=15.0)
    parser.add_argument("--concurrent", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--contrast-megabytes",
        type=float,
        default=0.0,
        help="also run a server with the bound off on bodies of this many MB (one round; "
        "keep it small: the old behaviour costs gigabytes per MB)",
    )
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    args = parser.parse_args()

    context = 4096  # the tiny model's
    chars = CHARS_PER_TOKEN_BOUND * context
    body_bound = JSON_BYTES_PER_CHAR * chars + MESSAGE_OVERHEAD_BYTES * context + BODY_SLACK_BYTES
    loads = {
        f"{args.megabytes:g} MB of text": _body(int(args.megabytes * 1_000_000)),
        "largest body under the bound": _body(body_bound - 100),
    }
    sizes = {name: len(body) for name, body in loads.items()}
    idle, results = _measure([], loads, args.concurrent, args.rounds)

    rows = [r for rounds in results.values() for r in rounds]
    peak = max(r["peak"] for r in rows)
    after = max(r["after"] for r in rows)
    met = peak / idle < PEAK_RATIO_TARGET and after / idle < HELD_RATIO_TARGET
    lines = [
        f"- server: `turnrl serve --policy tiny` in a child process (context {context:,} "
        f"positions: requests of more than {chars:,} characters of text are refused, bodies "
        f"over {body_bound:,} bytes while being read)",
        f"- load: {args.concurrent} concurrent requests, {args.rounds} rounds per body size",
        f"- idle RSS (after one small request): {idle:.0f} MiB",
        f"- targets: peak < {PEAK_RATIO_TARGET}x idle, RSS after the requests "
        f"< {HELD_RATIO_TARGET}x idle",
        "",
        *_table(idle, results, sizes),
        "",
        "Answers: "
        + "; ".join(f"{name}: {rounds[0]['message']}" for name, rounds in results.items()),
        "",
        f"Targets: {'ok' if met else 'MISSED'} (peak {peak / idle:.2f}x, "
        f"after {after / idle:.2f}x idle).",
    ]
    if args.contrast_megabytes > 0:
        name = f"{args.contrast_megabytes:g} MB of text, bound off"
        body = _body(int(args.contrast_megabytes * 1_000_000))
        off = ["--max-request-chars", str(10**9)]  # every body up to the 16 MiB cap is read
        contrast_idle, contrast = _measure(off, {name: body}, args.concurrent, 1)
        lines += [
            "",
            f"Contrast, the old behaviour (`--max-request-chars {10**9}`: the whole text is "
            f"tokenised before the context check), idle {contrast_idle:.0f} MiB:",
            "",
            *_table(contrast_idle, contrast, {name: len(body)}),
        ]
    report = "\n".join(lines)
    print(report)
    if not args.no_write:
        command = "make bench-gateway (= .venv/bin/python benchmarks/gateway_memory.py"
        command += f" --contrast-megabytes {args.contrast_megabytes:g})"
        write_section(
            Path(__file__).with_name("RESULTS.md"),
            "Gateway memory under huge requests",
            report,
            command,
            date.today(),
        )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # A terminated benchmark still kills its server (the finally blocks run).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
