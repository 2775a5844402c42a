"""`mur experiment rescore`: its command line; the re-scoring, the agreement and its report
are experiments/rescore.py's."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from mur.cli.args import OneLineParser
from mur.cli.connection import add_connection_arguments, connection_options
from mur.cli.experiment.publish import float_list, publish
from mur.evals.harness.records import SETTINGS, load_records
from mur.evals.questions import load_dataset
from mur.experiments import rescore
from mur.servers.clients.errors import ServerError
from mur.servers.connect import connect

PROG = "mur experiment rescore"


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Re-score a folder's traces on the server and print (or --out write) the agreement."""
    parser = OneLineParser(prog=prog, description=(rescore.__doc__ or "").split("\n")[0])
    parser.add_argument("folder", help="a results folder (records.jsonl and settings.json)")
    add_connection_arguments(
        parser,
        verifier=False,
        defaults="The backbone's vLLM server that re-scores the steps; unset, MUR_BASE_URL, "
        "else the embedded CPU server (started when not running).",
    )
    parser.add_argument("--gate", default="never", help="whose traces (default never)")
    parser.add_argument("--limit", type=int, default=20, help="traces to re-score")
    parser.add_argument("--gamma", type=float_list, default=(0.9,), help="MUR gammas to replay")
    parser.add_argument(
        "--data-dir", help="where the runs' questions came from (as mur solve's; default shipped)"
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--out", type=Path, help="also write the markdown summary here")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    try:  # the folder and its questions: the user's to fix (exit status 2)
        settings = json.loads((folder / SETTINGS).read_text())
        records = load_records(folder)
        names = {r["dataset"] for r in records}
        problems = {
            (p.dataset, p.id): p for name in names for p in load_dataset(name, args.data_dir)
        }
        traces = list(rescore.recorded_traces(records, problems, settings, args.gate, args.limit))
    except (FileNotFoundError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if not traces:
        parser.error(
            f"{folder} holds no {args.gate} traces of two or more steps without a scaled "
            "step (only a step followed by another is compared)"
        )
    try:
        backbone = connect(**connection_options(args), start=True, progress=True).backbone
        base_url, model = str(backbone.openai_api_base), str(backbone.model_name)
        result = asyncio.run(_run(args, base_url, model, traces, settings))
    except (ServerError, httpx.HTTPError, ValueError) as exc:  # the server, or its tokens
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    text = rescore.report(result, str(folder), base_url, model, len(traces))
    publish(text, args.out, prog, argv)
    return 0


async def _run(
    args: argparse.Namespace,
    base_url: str,
    model: str,
    traces: Sequence[rescore.Trace],
    settings: dict[str, Any],
) -> rescore.Agreement:
    async with httpx.AsyncClient(timeout=600) as client:
        scorer = rescore.Scorer(client, base_url, model)
        rescored = await rescore.rescore(scorer, traces, args.concurrency)
    gates = [(f"mur, gamma {g:g}", g, False) for g in args.gamma]
    gates += [(f"mur+bc, gamma {g:g}", g, True) for g in args.gamma]
    return rescore.agreement(traces, rescored, settings.get("alpha", 0.9), gates)


if __name__ == "__main__":
    sys.exit(main())
