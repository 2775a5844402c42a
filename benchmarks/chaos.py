"""`mur bench chaos`: do endpoint replicas on one PostgreSQL lose or garble anything while
replicas die, freeze, or the database freezes? The same load runs once undisturbed (the
baseline), then once per fault (`--faults`, FAULTS), a fault every 30-60 s:

- kills: a replica with runs in flight is SIGKILLed (the supervisor restarts it);
- freezes: a replica with runs in flight is SIGSTOPped for 2.5 leases, then SIGCONTed: a
  stalled holder whose runs the other replica takes over meanwhile;
- db-freezes: PostgreSQL is SIGSTOPped for `--db-pause` s (10) with its connections open, as
  a network partition looks.

Each phase starts fresh: a database of its own in one throwaway PostgreSQL, two replicas of
the endpoint over the scripted backbone (testing/fake_endpoint.py) behind vllm-router, run by
the supervisor of `mur endpoint --replicas` (which restarts a killed replica); the clients are
benchmarks/chaos_load.py's. Besides the clients' counts (BENCHMARKS.md says what each column
means), the database is read: checkpoints written by a claim that no longer held its run (a
trigger records each insert with the run's claim at that moment) and orphaned threads. Exit
status 1 when anything was lost, answered differently, wrong, written after a takeover or
orphaned.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
import numpy as np
import psycopg

from mur.benchmarks.chaos_load import Outcome, load
from mur.endpoint.replicas import REPLICA_HOST, child_env, router_argv
from mur.endpoint.supervisor import Child, Supervisor
from mur.servers.clients.errors import ServerError
from mur.servers.processes.facts import cpu_model
from mur.servers.processes.postgres import PostgresServer
from mur.servers.processes.replicas import check_router_installed

REPLICAS = 2
CALLS_PER_RUN = {"mur-critic": 5, "mur-critic-never": 3}
"""Backbone calls of one uninterrupted run of the scripted backbone: three steps, the second
judged and revised under the gamma-gate (testing/fake_endpoint.py)."""
STOP_GRACE_S = 30.0
LOG_TAIL = 30
FAULTS = ("kills", "freezes", "db-freezes")
FREEZE_LEASES = 2.5
"""A frozen replica stays stopped this many leases: its runs are taken over meanwhile."""
AUDIT = (
    "CREATE TABLE chaos_audit (thread_id TEXT, written_by INTEGER, holding INTEGER)",
    """CREATE FUNCTION chaos_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
        INSERT INTO chaos_audit SELECT NEW.thread_id, (NEW.metadata->>'mur_claim')::int,
            (SELECT claims FROM mur_runs WHERE thread_id = NEW.thread_id
                AND status = 'running');
        RETURN NEW; END $$""",
    "CREATE TRIGGER chaos_audit AFTER INSERT ON checkpoints FOR EACH ROW "
    "EXECUTE FUNCTION chaos_audit()",
)
"""Records, for every checkpoint inserted, the claim that wrote it and the claim holding the
run at that moment (in the inserting transaction)."""
STALE_WRITES = (
    "SELECT count(*) FROM chaos_audit "
    "WHERE written_by IS NOT NULL AND holding IS DISTINCT FROM written_by"
)
ORPHANS = """SELECT count(DISTINCT thread_id) FROM (
        SELECT thread_id FROM checkpoints UNION SELECT thread_id FROM checkpoint_blobs
        UNION SELECT thread_id FROM checkpoint_writes) AS written
    WHERE thread_id NOT IN (SELECT thread_id FROM mur_runs)"""


@dataclass
class Phase:
    """One phase's settings and what it measured."""

    name: str
    kills: list[str] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    calls: Counter[int] = field(default_factory=Counter)
    resumed: int = 0
    seconds: float = 0.0
    stale_writes: int = 0
    orphans: int = 0

    @property
    def answered(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.answered]

    @property
    def lost(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.answered]

    @property
    def differing(self) -> list[Outcome]:
        return [o for o in self.answered if not o.replayed_same]

    @property
    def wrong(self) -> list[Outcome]:
        return [o for o in self.answered if o.content != o.ask.expected]

    @property
    def recomputed(self) -> int:
        return sum(self.calls[o.ask.number] - CALLS_PER_RUN[o.ask.model] for o in self.answered)

    def latency(self, q: float) -> float:
        values = [o.latency for o in self.answered]
        return float(np.percentile(values, q)) if values else math.nan

    def retries(self) -> Counter[str]:
        return sum((o.retries for o in self.outcomes), Counter())


class Monkey(threading.Thread):
    """Keeps the supervisor restarting dead replicas and injects the phase's fault every so
    often until `until` (monotonic time), only while all replicas are up and one has runs in
    flight: a fault between two waves of requests would cost nothing and show nothing. A frozen
    replica or database is thawed after its pause, and at the latest when the monkey stops."""

    def __init__(
        self,
        supervisor: Supervisor,
        fault: Fault | None,
        rng: random.Random,
        until: float,
    ) -> None:
        super().__init__(name="chaos-monkey", daemon=True)
        self.supervisor, self.fault, self.rng = supervisor, fault, rng
        self.until = until
        self.done = threading.Event()
        self.kills: list[str] = []
        self.frozen: list[tuple[float, Callable[[], object]]] = []
        self.failure: BaseException | None = None

    def run(self) -> None:
        start = time.monotonic()
        fault = self.fault
        next_fault = start + self.rng.uniform(*fault.every) if fault else math.inf
        try:
            while not self.done.is_set():
                self.thaw(time.monotonic())
                self.supervisor.check()
                up = [c for c in self.supervisor.replicas if c.alive() and c.ready]
                now = time.monotonic()
                due = next_fault <= now < self.until and len(up) == REPLICAS and not self.frozen
                busy = [i for i, c in enumerate(up) if runs_in_flight(c.root)] if due else []
                if busy and fault is not None:
                    what = self.inject(fault, self.rng.choice(busy))
                    self.kills.append(f"{now - start:.0f}s {what}")
                    self.supervisor.say(f"chaos: {what} at {now - start:.0f} s")
                    next_fault = time.monotonic() + self.rng.uniform(*fault.every)
                self.done.wait(0.25)
        except BaseException as exc:  # the router died: the phase reports it
            self.failure = exc
        finally:
            self.thaw(math.inf)

    def inject(self, fault: Fault, index: int) -> str:
        if fault.name == "kills":
            return f"SIGKILL r{index + 1} (pid {self.supervisor.kill(index)})"
        if fault.name == "freezes":
            pid = self.supervisor.kill(index, signal.SIGSTOP)
            thaw = partial(self.supervisor.kill, index, signal.SIGCONT)
            self.frozen.append((time.monotonic() + fault.pause, thaw))
            return f"SIGSTOP r{index + 1} (pid {pid}) for {fault.pause:.0f} s"
        assert fault.database is not None
        fault.database.freeze()
        self.frozen.append((time.monotonic() + fault.pause, fault.database.thaw))
        return f"SIGSTOP PostgreSQL for {fault.pause:.0f} s"

    def thaw(self, now: float) -> None:
        due = [(at, thaw) for at, thaw in self.frozen if at <= now]
        for entry in due:
            self.frozen.remove(entry)
            entry[1]()


@dataclass(frozen=True)
class Fault:
    """A phase's fault: its name (FAULTS), seconds between two, how long a freeze lasts, and
    the database a db-freeze stops."""

    name: str
    every: tuple[float, float]
    pause: float = 0.0
    database: PostgresServer | None = None


def runs_in_flight(root: str) -> int:
    """The runs the endpoint at `root` says it executes (its /health, draining or not), 0 if
    it does not answer."""
    try:
        reply = httpx.get(f"{root}/health", timeout=1.0)
        return int(reply.json().get("runs_in_flight", 0))
    except (httpx.HTTPError, ValueError):
        return 0


def replicas_of(args: argparse.Namespace, calls_log: Path) -> list[Child]:
    children = []
    for index in range(REPLICAS):
        port = args.port + 1 + index
        command = [sys.executable, "-m", "mur.cli.fakes", "endpoint", "--port", str(port)]
        command += ["--max-runs", str(max(64, args.clients)), "--call-delay", str(args.call_delay)]
        command += ["--lease-seconds", str(args.lease_seconds), "--calls-log", str(calls_log)]
        children.append(Child(f"r{index + 1}", command, f"http://{REPLICA_HOST}:{port}"))
    return children


def fault_of(name: str, args: argparse.Namespace, database: PostgresServer) -> Fault | None:
    """The fault a phase named `name` injects (None for the baseline)."""
    if name == "baseline":
        return None
    pause = {"freezes": FREEZE_LEASES * args.lease_seconds, "db-freezes": args.db_pause}
    return Fault(name, args.kill_every, pause.get(name, 0.0), database)


def run_phase(
    name: str, args: argparse.Namespace, database: PostgresServer, folder: Path, prog: str
) -> Phase:
    """Start a phase's replicas and router over a fresh database, load them, stop them
    (the supervisor's lines start with `prog`)."""
    phase = Phase(name)
    url = database.create_database(f"chaos_{name.replace('-', '_')}")
    calls_log = folder / f"{name}-calls.log"
    ports = [args.port + 1 + i for i in range(REPLICAS)]
    router = Child("router", router_argv(ports, REPLICA_HOST, args.port), root_of(args.port))
    with open(folder / f"{name}.log", "w") as log:
        supervisor = Supervisor(
            replicas_of(args, calls_log), router, env=child_env(url, None), out=log, prog=prog
        )
        try:
            supervisor.start()
            with psycopg.connect(url, autocommit=True) as conn:
                for statement in AUDIT:
                    conn.execute(statement)
            rng = random.Random(f"{args.seed}-{name}")
            start = time.monotonic()
            fault = fault_of(name, args, database)
            monkey = Monkey(supervisor, fault, rng, until=start + args.seconds)
            monkey.start()
            phase.outcomes = asyncio.run(
                load(f"{root_of(args.port)}/v1", args.clients, args.seconds,
                     args.stream_share, name, drain=max(120.0, 6 * args.lease_seconds))
            )  # fmt: skip
            phase.seconds = time.monotonic() - start
            monkey.done.set()
            monkey.join()
            if monkey.failure is not None:
                raise ServerError(str(monkey.failure))
            phase.kills = monkey.kills
            supervisor.drain(STOP_GRACE_S, lambda: 1)
        except ServerError as exc:
            tail = "\n".join((folder / f"{name}.log").read_text().splitlines()[-LOG_TAIL:])
            raise ServerError(f"{name}: {exc}; the end of its log:\n{tail}") from None
        finally:
            supervisor.close()
    phase.calls = Counter(int(line.split()[0]) for line in calls_log.read_text().splitlines())
    with psycopg.connect(url) as conn:
        phase.resumed, phase.stale_writes, phase.orphans = (
            int(conn.execute(query).fetchone()[0])  # type: ignore[index]
            for query in ("SELECT COUNT(*) FROM mur_runs WHERE claims > 1", STALE_WRITES, ORPHANS)
        )
    return phase


def root_of(port: int) -> str:
    return f"http://{REPLICA_HOST}:{port}"


HEADER = (
    "| phase | faults | requests finished | lost | answered twice, differently "
    "| wrong answers | written after a takeover | orphans | runs resumed "
    "| model calls recomputed | retries 409 / 503 / other | p50 s | p95 s | finished/s |"
)


def table_row(phase: Phase) -> str:
    by_reason = phase.retries()
    other = by_reason.total() - by_reason["409"] - by_reason["503"]
    retries = f"{by_reason['409']} / {by_reason['503']} / {other}"
    cells = [
        phase.name, len(phase.kills), len(phase.answered), len(phase.lost),
        len(phase.differing), len(phase.wrong), phase.stale_writes, phase.orphans,
        phase.resumed, phase.recomputed, retries,
        f"{phase.latency(50):.2f}", f"{phase.latency(95):.2f}",
        f"{len(phase.answered) / max(phase.seconds, 1e-9):.1f}",
    ]  # fmt: skip
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def problems(phase: Phase) -> list[str]:
    found = [f"{phase.name}: lost {o.ask.key}: {o.error}" for o in phase.lost]
    found += [f"{phase.name}: {o.ask.key} answered differently" for o in phase.differing]
    found += [f"{phase.name}: {o.ask.key} wrong: {o.content[:80]!r}" for o in phase.wrong]
    if phase.stale_writes:
        found.append(f"{phase.name}: {phase.stale_writes} checkpoints written after a takeover")
    if phase.orphans:
        found.append(f"{phase.name}: {phase.orphans} threads left without their ledger row")
    return found


def port_free(port: int) -> bool:
    """Nothing listens on `port` of the loopback interface (a bind would succeed)."""
    with socket.socket() as sock:
        try:
            sock.bind((REPLICA_HOST, port))
        except OSError:
            return False
    return True


def run(args: argparse.Namespace, prog: str) -> int:
    """Every phase, the table; 0 only when nothing was lost, garbled or wrong."""
    phases: list[Phase] = []
    try:
        check_router_installed()
        with (
            tempfile.TemporaryDirectory(prefix="mur-chaos-") as folder,
            PostgresServer.start() as database,
        ):
            for name in ("baseline", *args.faults):
                print(f"{prog}: {name}: {args.seconds:.0f} s, {args.clients} clients", flush=True)
                phases.append(run_phase(name, args, database, Path(folder), prog))
    except ServerError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    print(f"CPU: {cpu_model()}; {REPLICAS} replicas behind vllm-router, one PostgreSQL; "
          f"{args.clients} clients, {args.seconds:.0f} s per phase, model calls of "
          f"{args.call_delay} s, lease {args.lease_seconds:.0f} s")  # fmt: skip
    print(HEADER)
    print("|" + "---|" * (HEADER.count("|") - 1))
    for phase in phases:
        print(table_row(phase))
    for phase in phases:
        if phase.kills:
            print(f"{phase.name}: {', '.join(phase.kills)}")
    found = [line for phase in phases for line in problems(phase)]
    for line in found[:40]:
        print(f"  {line}")
    return 1 if found else 0
