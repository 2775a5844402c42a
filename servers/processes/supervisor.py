"""Workers and the vllm-router in front of them, as child processes of one foreground process:
started in order, watched, restarted when one dies, stopped with it.

Unlike `mur servers up --replicas N` (replicas.py), whose servers outlive the command that
started them and are recorded for `status` and `down`, these children live and die with the
supervisor. Each runs in a process group of its own, so a Ctrl-C in the terminal reaches only
the supervisor, which decides what each child gets. Their output comes through here, each line
prefixed with the child's name. A worker that dies (a crash, an OOM kill, SIGKILL) is started
again on its port, after a pause that doubles while it keeps failing. The router dying, or a
worker dying before it ever answered at the first start, stops it all.

The supervisor dying, even of SIGKILL, takes its children along: each is tied to it by a pipe
only the supervisor holds (orphans.py), and a watcher in the child's group stops the group when
that pipe breaks, within seconds, so their ports are free for the next start. The workers get
the environment they are given (`env`: secrets among it); the router only what vllm-router
needs (replicas.router_env), no secret. `close` kills whatever is left; a gentler stop belongs
to a subclass that knows what its workers do on SIGTERM (the endpoint's drain).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, TextIO

from mur.servers.clients.errors import ServerError
from mur.servers.clients.probes import healthy
from mur.servers.processes.orphans import Tether
from mur.servers.processes.replicas import router_env as minimal_router_env

START_TIMEOUT_S = 300.0
"""For the workers and the router to answer; a first worker started alone (one that starts
something the others then reuse) is bounded by what it starts."""
RESTART_PAUSE_S = 1.0
RESTART_PAUSE_MAX_S = 60.0
ROUTER_STOP_S = 10.0
POLL_S = 0.25


@dataclass
class Child:
    """One process the supervisor runs: its name (the prefix of its lines), argv and the root
    URL whose /health says it is ready."""

    name: str
    command: list[str]
    root: str
    process: subprocess.Popen[str] | None = None
    ready: bool = False
    restarts: int = 0
    pause: float = RESTART_PAUSE_S
    start_after: float = 0.0
    exit_codes: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def back_off(self) -> None:
        """Wait twice as long before the next restart (at most RESTART_PAUSE_MAX_S)."""
        self.pause = min(self.pause * 2, RESTART_PAUSE_MAX_S)


class WorkerSupervisor:
    """Workers (`replicas`) behind a router: `start`, then `check` periodically until told to
    stop; `close` kills whatever is left (on any error path). `env` is the workers'
    environment, `router_env` the router's (default: what vllm-router needs of this process's
    environment, replicas.router_env)."""

    def __init__(
        self,
        replicas: Sequence[Child],
        router: Child,
        *,
        env: Mapping[str, str],
        out: TextIO,
        prog: str,
        router_env: Mapping[str, str] | None = None,
    ) -> None:
        self.replicas, self.router = list(replicas), router
        self.env, self.out, self.prog = dict(env), out, prog
        self.router_env = dict(minimal_router_env() if router_env is None else router_env)
        self.stopping = False
        """Set to stop: a plain flag, so a signal handler may set it (an Event's lock may be
        held by the very thread the handler interrupts)."""
        self._lock = threading.Lock()
        self.tether = Tether()

    def say(self, text: str, name: str | None = None) -> None:
        with self._lock:
            print(f"[{name or self.prog}] {text}", file=self.out, flush=True)

    def _spawn(self, child: Child) -> None:
        try:
            child.process = subprocess.Popen(
                self.tether.command(child.command),  # it dies with this process (orphans.py)
                env=self.router_env if child is self.router else self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                process_group=0,  # a terminal's Ctrl-C reaches the supervisor alone
                pass_fds=self.tether.pass_fds,
            )
        except OSError as exc:  # fork refused (no memory, too many processes)
            raise ServerError(f"could not start {child.name}: {exc}") from None
        child.ready = False
        stream = child.process.stdout
        assert stream is not None
        threading.Thread(
            target=self._pump, args=(stream, child.name), name=f"log-{child.name}", daemon=True
        ).start()

    def _pump(self, stream: IO[str], name: str) -> None:
        with contextlib.suppress(ValueError, OSError):  # closed when the child goes
            for line in stream:
                self.say(line.rstrip("\n"), name)

    def start(self, *, first_alone: bool = False, timeout: float = START_TIMEOUT_S) -> None:
        """The workers, then the router, each answering /health (else ServerError). With
        `first_alone` the first worker starts before the others: it may start something
        shared (the endpoint's embedded model server), which they then reuse instead of racing
        to start it too; that wait is bounded by what it starts (it exits if that fails)."""
        first, *rest = self.replicas
        self._spawn(first)
        if first_alone:
            self._wait_ready([first], None)
        deadline = time.monotonic() + timeout
        for child in rest:
            self._spawn(child)
        self._wait_ready(self.replicas, deadline)
        self._spawn(self.router)
        self._wait_ready([self.router], deadline)

    def _wait_ready(self, children: Sequence[Child], deadline: float | None) -> None:
        waiting = list(children)
        while waiting:
            for child in list(waiting):
                assert child.process is not None
                code = child.process.poll()
                if code is not None:
                    raise ServerError(
                        f"{child.name} exited with status {code} before it answered at "
                        f"{child.root}: see its lines above"
                    )
                if healthy(child.root):
                    child.ready = True
                    waiting.remove(child)
            if self.stopping:
                raise ServerError("stopped before every replica had started")
            if waiting and deadline is not None and time.monotonic() > deadline:
                names = ", ".join(child.name for child in waiting)
                raise ServerError(f"{names} did not answer /health in time: see the lines above")
            if waiting:
                time.sleep(POLL_S)

    def check(self) -> None:
        """Restart workers that died (after their pause); ServerError if the router died."""
        code = self.router.process.poll() if self.router.process else None
        if code is not None:
            raise ServerError(f"vllm-router exited with status {code}: see its lines above")
        now = time.monotonic()
        for child in self.replicas:
            if child.alive():
                if not child.ready and healthy(child.root):
                    child.ready, child.pause = True, RESTART_PAUSE_S
                    self.say(f"{child.name} answers again at {child.root}")
                continue
            if child.start_after == 0.0:  # just found dead: schedule its restart
                assert child.process is not None
                child.exit_codes.append(child.process.returncode)
                child.start_after = now + child.pause
                self.say(
                    f"{child.name} (pid {child.pid}) exited with status "
                    f"{child.process.returncode}: restarting it in {child.pause:.0f} s"
                )
                if not child.ready:  # it died starting: wait longer next time
                    child.back_off()
            elif now >= child.start_after and not self.stopping:
                try:
                    self._spawn(child)
                except ServerError as exc:  # try again later, as after a failed start
                    child.back_off()
                    child.start_after = now + child.pause
                    self.say(f"{exc}: trying again in {child.pause:.0f} s")
                    continue
                child.start_after, child.restarts = 0.0, child.restarts + 1

    def kill(self, index: int, sig: int = signal.SIGKILL) -> int:
        """Send `sig` to worker `index` (a fault to inject); its pid."""
        child = self.replicas[index]
        if child.process is None or not child.alive():
            raise ServerError(f"{child.name} is not running")
        child.process.send_signal(sig)
        return child.process.pid

    def signal_replicas(self, sig: int) -> None:
        for child in self.replicas:
            if child.alive():
                assert child.process is not None
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(sig)

    def stop_router(self) -> None:
        process = self.router.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(ROUTER_STOP_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def close(self) -> None:
        """Kill every child still running and reap them (error paths, tests); untie them."""
        self.stopping = True
        for child in [*self.replicas, self.router]:
            if child.process is not None and child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.process.pid, signal.SIGKILL)
                child.process.wait()
        self.tether.close()
