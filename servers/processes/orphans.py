"""Children that do not outlive the process that started them, even when it is SIGKILLed.

A supervisor starts each child in a process group of its own (so a terminal's Ctrl-C reaches
the supervisor alone), which also means nothing stops the children when the supervisor dies
without a word. Here the supervisor holds the write end of a pipe (a `Tether`) that no other
process holds: the kernel closes it when the supervisor dies, however it dies. Each child is
started through this file as a tiny shim:

    python -I -S .../orphans.py FD -- PROGRAM ARGS...

The shim forks a watcher into the child's process group, then execs PROGRAM, which keeps the
pid, the output pipes and the exit status the supervisor expects; the program itself needs no
code of its own, so this works for vllm-router as for the project's replicas. The watcher
waits on the pipe's read end (FD) and on the program: the program exiting ends the watcher;
EOF on the pipe (the supervisor gone) makes it stop the group: SIGTERM (a replica drains), a
second SIGTERM (it cancels its runs at their last checkpoint and exits), SIGKILL for what is
left, the watcher included. Being in the group keeps the group's id from being reused while
the watcher waits, so it never signals a stranger.

Why not PR_SET_PDEATHSIG: the kernel sends it when the *thread* that forked the child ends,
and `mur bench chaos` restarts replicas from a thread of its own that ends before the
supervisor does; a pipe belongs to the process. The shim imports nothing of the project (it
runs isolated, without site) so it starts in milliseconds.
"""

from __future__ import annotations

import os
import select
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

ESCALATION = ((signal.SIGTERM, 2.0), (signal.SIGTERM, 3.0))
"""What the watcher sends the group when the supervisor is gone, and how long it then waits
for the program to exit before the next step; SIGKILL comes last."""
POLL_S = 0.5
"""Without pidfds (not Linux), how often the watcher looks whether its program still runs."""
USAGE = "usage: orphans.py FD -- PROGRAM [ARGS...]"


class Tether:
    """The pipe that ties children to this process: `command` wraps a child's argv in the
    shim, `pass_fds` is what its Popen must let through; `close` ends the tie (children still
    running then are stopped by their watchers)."""

    def __init__(self) -> None:
        # os.pipe's ends are not inheritable: only a Popen given `pass_fds` passes the read end
        # on, and the write end stays in this process alone.
        self._read, self._write = os.pipe()
        self.closed = False

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self._read,)

    def command(self, argv: Sequence[str]) -> list[str]:
        if self.closed:
            raise ValueError("the tether is closed: no child can be tied to it")
        return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(self._read), "--", *argv]

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self._read)
            os.close(self._write)


def main(argv: Sequence[str]) -> NoReturn:
    """The shim: fork the watcher, exec the program (127 if it cannot be run)."""
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print(USAGE, file=sys.stderr)
        os._exit(2)
    fd, command = int(argv[0]), list(argv[2:])
    program = os.getpid()  # the program keeps the shim's pid through exec
    if os.fork() == 0:
        watch(fd, program)
    os.close(fd)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"cannot run {command[0]}: {exc}", file=sys.stderr, flush=True)
        os._exit(127)


def watch(fd: int, program: int) -> NoReturn:
    """Wait for the program to exit (then exit) or the tether to break (then stop the group)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the group's own signals are for the program
    quiet = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):  # the supervisor reads the program's output until it closes
        os.dup2(quiet, std)
    exited = _exit_fd(program)
    if os.getppid() != program:  # exec failed and the shim is gone already
        os._exit(0)
    while True:
        waited = [fd] if exited is None else [fd, exited]
        ready, _, _ = select.select(waited, [], [], POLL_S if exited is None else None)
        if _gone(program, exited, ready):
            os._exit(0)
        if fd in ready and not os.read(fd, 1):  # EOF: the supervisor died
            break
    stop_group(program, exited)


def stop_group(program: int, exited: int | None) -> NoReturn:
    """SIGTERM, SIGTERM, SIGKILL to this process group (ESCALATION), the next step only while
    the program still runs; the last one ends this watcher too."""
    group = os.getpgrp()
    for sig, wait in ESCALATION:
        os.killpg(group, sig)
        if _exited_within(program, exited, wait):
            break
    os.killpg(group, signal.SIGKILL)  # stragglers of the program, and this watcher
    os._exit(0)  # not reached


def _exit_fd(program: int) -> int | None:
    """A pidfd that becomes readable when `program` exits; None where there are none."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        return int(pidfd_open(program))
    except ProcessLookupError:
        os._exit(0)  # the program is gone already
    except OSError:  # a kernel before 5.3
        return None


def _gone(program: int, exited: int | None, ready: Sequence[int]) -> bool:
    return exited in ready if exited is not None else os.getppid() != program


def _exited_within(program: int, exited: int | None, seconds: float) -> bool:
    if exited is not None:
        return bool(select.select([exited], [], [], seconds)[0])
    waited = 0.0
    while waited < seconds:
        if os.getppid() != program:
            return True
        select.select([], [], [], POLL_S)
        waited += POLL_S
    return os.getppid() != program


if __name__ == "__main__":
    main(sys.argv[1:])
