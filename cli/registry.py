"""Every subcommand of `mur`, in one place: its name, the module whose `main` runs it, and its
line in `mur --help`.

Each main is `main(argv, prog=...) -> int` over its own parser, so `mur report --help` and its
errors name `mur report` and no parser is written twice. A module is imported only when its
subcommand runs, so `mur --help` does not pay for LangGraph, vLLM's clients or matplotlib.
Adding a command is one entry here (tests/unit/test_commands.py finds a module with a main
that no entry reaches).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A subcommand: `module`'s main runs it, or, for a group, one of `commands` does.
    `extra` is the install extra it needs beyond the base (nodes.extras): without it, the
    command answers with one line naming it."""

    name: str
    help: str
    module: str = ""
    commands: tuple[Command, ...] = ()
    extra: str = ""

    def find(self, name: str) -> Command | None:
        """The subcommand of this group called `name`, if any."""
        return next((command for command in self.commands if command.name == name), None)

    def leaves(self, prefix: str = "") -> list[tuple[str, Command]]:
        """Every runnable command under this one with its words after `mur` ("bench scaleout")."""
        words = f"{prefix} {self.name}".strip()
        if not self.commands:
            return [(words, self)]
        return [leaf for command in self.commands for leaf in command.leaves(words)]


EXPERIMENTS = Command(
    "experiment",
    "The paper's experiments, and checks of recorded results on another server",
    commands=(
        Command(
            "table1",
            "the paper's Table 1 in miniature: every gate and baseline, resumable",
            "mur.cli.experiment.table1",
            extra="lab",
        ),
        Command(
            "rescore",
            "re-score a folder's recorded steps on another server: the same experiment?",
            "mur.cli.experiment.rescore",
            extra="lab",
        ),
        Command(
            "bfcl",
            "BFCL's multi-turn tool-calling cases by an agent with MURMiddleware, resumable",
            "mur.cli.experiment.bfcl",
            extra="lab",
        ),
        Command(
            "verdicts",
            "replay a folder's critic judgements with forced verdicts",
            "mur.cli.experiment.verdicts",
            extra="lab",
        ),
    ),
)

BENCHMARKS = Command(
    "bench",
    "Performance suites (BENCHMARKS.md)",
    commands=(
        Command(
            "chaos",
            "endpoint replicas on one PostgreSQL, one SIGKILLed every 30-60 s: nothing lost?",
            "mur.cli.bench.chaos",
            extra="serve",
        ),
        Command(
            "client",
            "the client's own CPU per token against an instant vLLM-shaped server, layer by layer",
            "mur.cli.bench.client_cost",
        ),
        Command(
            "economy",
            "token economy and orchestration speed on one server",
            "mur.cli.bench.economy",
            extra="lab",
        ),
        Command(
            "endpoint_load",
            "load-test the OpenAI-compatible endpoint and check every reply",
            "mur.cli.bench.endpoint_load",
            extra="serve",
        ),
        Command(
            "formats",
            "each weight format served in turn: decode rate at 1/8/32 streams, one answer's wait",
            "mur.cli.bench.formats",
            extra="lab",
        ),
        Command(
            "install",
            "what `pip install mur` and each extra install: packages, MB, import time",
            "mur.cli.bench.install_footprint",
        ),
        Command(
            "pair_cores",
            "a backbone and a verifier server on one machine: shared or split cores",
            "mur.cli.bench.pair_cores",
        ),
        Command(
            "scaleout",
            "replicas behind vllm-router, with and without session affinity",
            "mur.cli.bench.scaleout",
            extra="lab",
        ),
        Command(
            "trace_time",
            "the wait for one answer under each trace rule or step router, each question alone",
            "mur.cli.bench.trace_time",
            extra="lab",
        ),
    ),
)

MUR = Command(
    "mur",
    "MUR: momentum-uncertainty-guided reasoning over vLLM servers",
    commands=(
        Command(
            "solve",
            "solve one question step by step, or run an evaluation (as `python run.py`)",
            "mur.cli.solve",
        ),
        Command(
            "servers",
            "start, stop and inspect vLLM servers: up, down, status, profiles, model",
            "mur.cli.servers",
        ),
        Command(
            "endpoint", "serve MUR as an OpenAI-compatible API", "mur.cli.endpoint", extra="serve"
        ),
        Command(
            "report",
            "a run folder's tables and plots, again from its records",
            "mur.cli.report",
            extra="lab",
        ),
        Command(
            "compare",
            "two results folders side by side, paired on their common questions",
            "mur.cli.compare",
            extra="lab",
        ),
        Command(
            "records",
            "maintain a run folder's records (drop one gate's runs)",
            "mur.cli.records",
        ),
        EXPERIMENTS,
        BENCHMARKS,
    ),
)
