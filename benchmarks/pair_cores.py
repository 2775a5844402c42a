"""`mur bench pair_cores`: a backbone and a verifier server on one machine, sharing
every core or one half each: which serves MUR faster?

For each way (`shared`, `split`) it stops both profiles' servers, starts the pair the way
`mur servers up --profile B --verifier-profile V --cores WAY` does, and runs the same
benchmark load through `mur solve` (the first N MATH-500 questions, the critic, gates never and
always, so the load has a backbone-only half and a half where the verifier works on every
step), then reports generated tokens per second of wall time, per server and in all. Tokens
differ between the two runs (sampling); tokens per second is what compares. The winner is
`servers.processes.launcher.PAIR_CORES`; numbers in servers/README.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mur.evals.harness.records import load_records
from mur.servers.processes.launcher import CoreSharing, down, up_pair


@dataclass(frozen=True)
class PairRun:
    cores: str
    wall_s: float
    backbone_tokens: int
    external_tokens: int
    questions: int

    @property
    def tokens_per_s(self) -> float:
        return (self.backbone_tokens + self.external_tokens) / self.wall_s


def run_load(args: argparse.Namespace, cores: CoreSharing, out: Path) -> PairRun:
    for profile in (args.profile, args.verifier_profile):
        down(profile)
    up_pair(args.profile, args.verifier_profile, cores=cores, progress=False)
    command = [
        sys.executable, "-m", "mur", "solve", "--strategy", "critic", "--dataset", "math500",
        "--limit", str(args.limit), "--gate", "never,always", "--profile", args.profile,
        "--verifier-profile", args.verifier_profile, "--concurrency", str(args.concurrency),
        "--max-steps", str(args.max_steps), "--out", str(out),
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    records = load_records(out)
    return PairRun(
        cores=cores,
        wall_s=wall,
        backbone_tokens=sum(r["usage"]["backbone_tokens"] for r in records),
        external_tokens=sum(r["usage"]["external_tokens"] for r in records),
        questions=len(records),
    )


def table(runs: list[PairRun]) -> str:
    lines = [
        "| cores | runs | wall s | backbone tokens | verifier tokens | tok/s in all |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| {run.cores} | {run.questions} | {run.wall_s:.0f} | {run.backbone_tokens:,} | "
            f"{run.external_tokens:,} | {run.tokens_per_s:.1f} |"
        )
    return "\n".join(lines)
