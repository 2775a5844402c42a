"""`python -m evals.rescore` against the real CPU vLLM server: the server that generated a
table's steps, asked to score them as prompt tokens, gives back the uncertainties recorded."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from evals.datasets import load_dataset
from evals.records import load_records
from evals.rescore import Scorer, agreement, main, recorded_traces, rescore
from evals.table1 import ROOT

pytestmark = pytest.mark.integration


def test_the_recording_server_scores_its_own_steps_as_recorded(
    cpu_server, tmp_path: Path, test_data: Path
) -> None:
    folder = tmp_path / "never"
    run = subprocess.run(
        [
            sys.executable, "run.py", "--strategy", "critic", "--dataset", "math500",
            "--limit", "3", "--gate", "never", "--base-url", cpu_server.base_url,
            "--profile", "cpu-tiny", "--data-dir", str(test_data), "--step-format", "paragraph",
            "--max-steps", "4", "--max-step-tokens", "48", "--out", str(folder),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]

    settings = json.loads((folder / "settings.json").read_text())
    problems = {(p.dataset, p.id): p for p in load_dataset("math500", test_data)}
    traces = list(recorded_traces(load_records(folder), problems, settings, "never", 3))
    assert sum(len(t.steps) for t in traces) > 0

    async def scores() -> list[list[float | None]]:
        async with httpx.AsyncClient(timeout=300) as client:
            scorer = Scorer(client, cpu_server.base_url, cpu_server.model)
            return await rescore(scorer, traces, concurrency=2)

    result = agreement(traces, asyncio.run(scores()), 0.9, [("mur", 0.9, False)])
    assert result.aligned >= result.steps / 2  # most steps come out as the tokens generated
    # Generated and prompt logprobs of one server differ by numeric noise only (batching,
    # bf16), far less than steps differ from each other.
    assert result.mean_abs_diff < 0.1 * result.between_steps_sd
    assert result.correlation > 0.95

    out = tmp_path / "rescore.md"
    code = main(
        [str(folder), "--base-url", cpu_server.base_url, "--data-dir", str(test_data),
         "--limit", "3", "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    text = out.read_text()
    assert "tokenized as generated and compared" in text and "| mur, gamma 0.9 |" in text
    assert text.rstrip().endswith(f"--limit 3 --out {out}")
