"""A stand-in for a `mur solve --worker` process that speaks its protocol (evals.harness.worker)
without LangGraph or a server, so the parent's side (evals.harness.pool) is tested in
milliseconds a process.

    python tests/fake_worker.py MODE LOG

MODE: `done` answers each run `done` after a short wait (the first worker to start waits much
longer: a slow worker beside a fast one); `done:N` too, but the first worker holds its first
run until LOG shows N runs answered by the other (at most HOLD_S), so which worker answers what
does not hang on the machine's speed; `server_fails` answers each run `failed`, the server's
fault; `exit3` exits with status 3 before it is ready. Each run it answers is appended to LOG
as `PID KEY`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

FAST_S, SLOW_S = 0.01, 0.5
HOLD_S = 60.0
"""The longest the slow worker of `done:N` holds its run: a parent that split the runs between
the workers in advance never lets the other answer N, and the test then fails in a minute."""


def send(**event: object) -> None:
    print(json.dumps(event), flush=True)


def answered(log: Path) -> int:
    try:
        return len(log.read_text().splitlines())
    except FileNotFoundError:
        return 0


def hold(log: Path, others: int) -> None:
    """Wait until LOG shows `others` runs answered (by the other worker), HOLD_S at most."""
    deadline = time.monotonic() + HOLD_S
    while answered(log) < others and time.monotonic() < deadline:
        time.sleep(0.01)


def main(mode: str, log: Path) -> int:
    mode, _, count = mode.partition(":")
    if mode == "exit3":
        return 3
    try:  # the first worker to get here is the slow one
        os.close(os.open(log.with_suffix(".slow"), os.O_CREAT | os.O_EXCL))
        wait, others = SLOW_S, int(count or 0)
    except FileExistsError:
        wait, others = FAST_S, 0
    start = json.loads(sys.stdin.readline())
    assert start["do"] == "start", start
    send(event="ready")
    for line in sys.stdin:
        request = json.loads(line)
        if request["do"] != "run":
            return 0  # end (nothing is left in flight: runs are answered one by one) or cancel
        if others:
            hold(log, others)
            others = 0
        else:
            time.sleep(wait)
        with log.open("a") as handle:
            handle.write(f"{os.getpid()} {request['key']}\n")
        if mode == "server_fails":
            send(event="failed", key=request["key"], why="APIError: injected 500", server=True)
        else:
            send(event="done", key=request["key"], tokens=10, here=10)
    return 0  # the parent is gone


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
