"""A stand-in for a `mur solve --worker` process that speaks its protocol (evals.harness.worker)
without LangGraph or a server, so the parent's side (evals.harness.pool) is tested in
milliseconds a process.

    python tests/fake_worker.py MODE LOG

MODE: `done` answers each run `done` after a short wait (the first worker to start waits much
longer: a slow worker beside a fast one); `server_fails` answers each run `failed`, the
server's fault; `exit3` exits with status 3 before it is ready. Each run it answers is appended
to LOG as `PID KEY`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

FAST_S, SLOW_S = 0.01, 0.5


def send(**event: object) -> None:
    print(json.dumps(event), flush=True)


def main(mode: str, log: Path) -> int:
    if mode == "exit3":
        return 3
    try:  # the first worker to get here is the slow one
        os.close(os.open(log.with_suffix(".slow"), os.O_CREAT | os.O_EXCL))
        wait = SLOW_S
    except FileExistsError:
        wait = FAST_S
    start = json.loads(sys.stdin.readline())
    assert start["do"] == "start", start
    send(event="ready")
    for line in sys.stdin:
        request = json.loads(line)
        if request["do"] != "run":
            return 0  # end (nothing is left in flight: runs are answered one by one) or cancel
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
