"""`mur experiment rescore` against the real CPU vLLM server: the server that generated a
table's steps, asked to score them as prompt tokens, gives back the uncertainties recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from mur.cli.experiment.rescore import main
from mur.evals.harness.records import load_records
from mur.evals.questions import load_dataset
from mur.experiments.rescore import RecordedStep, Scorer, Trace, recorded_traces, rescore
from mur.nodes.llm import CONTINUE_FINAL_MESSAGE

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = 20  # MATH-500's first: see test_rescore_runs_on_a_recorded_folder

pytestmark = pytest.mark.integration


async def test_a_step_the_server_generated_scores_as_generated(cpu_server) -> None:
    """A step generated here (greedy, to the token cap, so no separator) and then sent back as
    prompt tokens gets the uncertainty its generation logprobs gave."""
    prefix = ({"role": "user", "content": "Tell me about a city you like, and why."},
              {"role": "assistant", "content": "Step1:"})  # fmt: skip
    async with httpx.AsyncClient(timeout=300) as client:
        reply = await client.post(
            f"{cpu_server.base_url}/chat/completions",
            json={"model": cpu_server.model, "messages": list(prefix), "max_tokens": 6,
                  "temperature": 0, "logprobs": True, **CONTINUE_FINAL_MESSAGE},
        )  # fmt: skip
        choice = reply.json()["choices"][0]
        logprobs = [t["logprob"] for t in choice["logprobs"]["content"]]
        assert choice["finish_reason"] == "length" and len(logprobs) == 6
        m = -sum(logprobs) / len(logprobs)
        step = RecordedStep(1, prefix, choice["message"]["content"], "", m, 6)
        trace = Trace("k", (m, m), (step,))
        (scored,) = await rescore(Scorer(client, cpu_server.base_url, cpu_server.model), [trace], 1)
    assert scored[0] is not None
    assert abs(scored[0] - m) < 0.01 + 0.02 * m  # numeric noise only (batching, bf16)


def test_rescore_runs_on_a_recorded_folder(cpu_server, tmp_path: Path) -> None:
    """Steps are capped at 8 tokens so that step 1 ends at the cap and lines up: SmolLM2's
    tokenizer writes a blank line that more text follows otherwise than one that ends the text,
    so a step that ended at the blank-line separator, or follows one, never does (at 48
    tokens, CI drew two step 1s that ended at a blank line, and nothing was left to compare).
    Twenty questions, as sampling decides which line up: SmolLM2 answers some in one step (no
    step followed by another), and a step 1 whose last token was whitespace, stripped in the
    trace, tokenizes shorter. With two questions CI once drew two such step 1s; with twenty,
    three runs here compared 18, 13 and 14 step 1s (of 18, 14 and 14)."""
    folder = tmp_path / "never"  # MATH-500, as the tests' own questions take one step
    run = subprocess.run(
        [
            sys.executable, "run.py", "--strategy", "critic", "--dataset", "math500",
            "--limit", str(QUESTIONS), "--gate", "never", "--base-url", cpu_server.base_url,
            "--profile", "cpu-tiny", "--step-format", "paragraph",
            "--max-steps", "2", "--max-step-tokens", "8", "--out", str(folder),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    settings = json.loads((folder / "settings.json").read_text())
    problems = {(p.dataset, p.id): p for p in load_dataset("math500")}
    traces = list(recorded_traces(load_records(folder), problems, settings, "never", QUESTIONS))
    out = tmp_path / "rescore.md"
    args = ["--base-url", cpu_server.base_url, "--limit", str(QUESTIONS), "--out", str(out)]
    code = main([str(folder), *args])
    assert code == 0
    text = out.read_text()
    steps = sum(len(t.steps) for t in traces)
    assert f"{len(traces)} traces, {steps} steps followed by another" in text
    assert "| mur, gamma 0.9 |" in text
    assert text.rstrip().endswith(f"--limit {QUESTIONS} --out {out}")
