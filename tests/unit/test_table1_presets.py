"""experiments.table1 --preset: the paper's setting as one command (experiments.presets), its
dry run (every command, where GPQA comes from, the paper's token budget) and its bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mur.cli.experiment.table1 import main
from mur.evals.questions import DataNotFoundError, load_dataset
from mur.experiments.presets import PAPER_GPU, PRESETS, DatasetRun, run_tokens
from mur.experiments.table1 import Table1Error, Table1Plan
from mur.servers.processes.profiles import get_profile

PAPER_ARGS = (
    "--profile qwen3-1.7b --verifier-profile genprm-1.5b --thinking-budget 2048 "
    "--thinking-style qwen3"
)


@pytest.fixture(autouse=True)
def no_server_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands printed depend on where the backbone is: no environment says so here."""
    for name in ("MUR_BASE_URL", "MUR_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)


def dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["--preset", "paper-gpu", "--dry-run", *args]) == 0
    return capsys.readouterr().out


def test_the_dry_run_prints_every_command_with_its_dataset_settings_and_the_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = dry_run(capsys, "--results", str(tmp_path), "--data-dir", str(tmp_path / "gpqa"))
    commands = [line for line in out.splitlines() if line.startswith("mur solve ")]
    # 4 datasets x 4 strategies, main phases only: random waits for MUR's records, no sweep.
    assert len(commands) == 16
    for dataset, limit, gamma, samples in [("math500", 500, "0.9", ""),
                                           ("aime24", 30, "0.8", " --samples 16"),
                                           ("aime25", 30, "0.8", " --samples 16"),
                                           ("gpqa_diamond", 198, "0.7", "")]:  # fmt: skip
        for strategy in ("critic", "best_of_n", "foresight", "thinking"):
            data_dir = f" --data-dir {tmp_path / 'gpqa'}" * (dataset == "gpqa_diamond")
            assert (
                f"mur solve --strategy {strategy} --dataset {dataset} --limit {limit} "
                f"--gate never,always,mur,mur+bc,average,smart --gamma {gamma}{samples}"
                f"{data_dir} --base-url http://127.0.0.1:8000/v1 {PAPER_ARGS} "
                f"--out {tmp_path / f'{dataset}-{strategy}-qwen3-1.7b'}"
            ) in commands
    assert "# aime24 / thinking / main (0 of 2880 runs recorded)" in out
    assert "all 30 questions x 16 samples, and" in out
    # The data dir holds no GPQA: the dry run says so, and still shows the plan.
    assert f"# not found: benchmark data directory {tmp_path / 'gpqa'}" in out
    assert re.search(r"#   aime24 +13,440 +[\d,]+ +[\d,]+\n", out)
    assert re.search(r"#   total +46,424 +[\d,]+ +[\d,]+\n", out)
    assert "# - thinking has no paper figure" in out and "an upper bound" in out


def test_the_budget_is_the_papers_table_per_run(capsys: pytest.CaptureFixture[str]) -> None:
    """One question of critic: never 2,662 + always 2,128 + five gates (mur, mur+bc, average,
    smart, random) at MUR's 2,625; external at most (6.2 + 5 x 0.85) judgements x 1024."""
    out = dry_run(capsys, "--strategies", "critic", "--dataset", "math500", "--limit", "1")
    assert "#   total                7          17,915              10,701\n" in out
    # Thinking: Vanilla + scaled steps x (the 2048 cap + one step written again).
    always = run_tokens("thinking", "always", 2048)
    assert always is not None and always.backbone == pytest.approx(2 * 2662 + 6.2 * 2048)
    assert run_tokens("critic", "random@0.2", 2048) == run_tokens("critic", "mur+bc", 2048)
    assert run_tokens("beam", "mur", 2048) is None


def test_flags_narrow_the_preset_and_the_users_mur_flags_come_last(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    narrowed = ["--dataset", "aime25", "--limit", "2", "--strategies", "thinking"]
    server = ["--base-url", "http://gpu:9000/v1"]
    out = dry_run(capsys, *narrowed, *server, "--", "--thinking-style", "prefix")
    (command,) = [line for line in out.splitlines() if line.startswith("mur solve ")]
    assert "--dataset aime25 --limit 2 " in command and "--gamma 0.8 --samples 16" in command
    assert "--base-url http://gpu:9000/v1 --profile qwen3-1.7b" in command
    assert "--thinking-style qwen3 --thinking-style prefix --out" in command  # last one wins
    assert "gpqa" not in out
    monkeypatch.setenv("MUR_BASE_URL", "http://elsewhere:8000/v1")
    assert "--base-url" not in dry_run(capsys, "--dataset", "math500")  # mur reads the env


def test_the_random_baseline_waits_for_every_sample_of_mur(tmp_path: Path) -> None:
    table = Table1Plan(
        strategies=("critic",),
        datasets=(DatasetRun("aime24", limit=1, gamma=0.8, samples=2),),
        sweep=(),
        sweep_strategies=(),
        results=tmp_path,
        tag="m",
        run_args=(),
    )
    random_phase = table.phases()[1]
    assert table.argv(table.phases()[0])[8:12] == ["--gamma", "0.8", "--samples", "2"]
    random_phase.folder.mkdir()
    records = random_phase.folder / "records.jsonl"
    for sample in (0, 1):
        with pytest.raises(Table1Error, match=rf"1 questions x 2 samples, .* on {sample}:"):
            table.random_gate(random_phase)
        record = {"key": str(sample), "problem_id": "p0", "sample": sample, "gate": "mur",
                  "gamma": 0.8, "steps_total": 3, "steps_scaled": 1}  # fmt: skip
        with records.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
    assert table.random_gate(random_phase) == "random@0.5"
    assert table.progress(random_phase) == (0, 2)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--preset", "paper-cpu"], "mur experiment table1: error: argument --preset: "
         "unknown preset 'paper-cpu': choose one of paper-gpu, cascade; see --help"),
        (["--preset", "paper-gpu", "--gamma", "0.9"], "mur experiment table1: --gamma 0.9: the "
         "preset paper-gpu sets gamma by dataset (math500 0.9, aime24 0.8, aime25 0.8, "
         "gpqa_diamond 0.7); drop --gamma, or drop --preset"),
        (["--preset", "paper-gpu", "--dataset", "aime24,gsm8k"], "mur experiment table1: unknown "
         "dataset 'gsm8k': choose one of math500, aime24, aime25, gpqa_diamond"),
        (["--dataset", "aime24,aime25"], "mur experiment table1: --dataset aime24,aime25: one "
         "dataset (several: --preset)"),
        (["--preset", "paper-gpu", "--limit", "0"], "mur experiment table1: error: argument "
         "--limit: must be > 0, got 0; see --help"),
        (["--limit", "-5"], "mur experiment table1: error: argument --limit: must be > 0, got -5; "
         "see --help"),
        (["--concurrency", "0"], "mur experiment table1: error: argument --concurrency: must be "
         "> 0, got 0; see --help"),
        # mur solve's own check of a gate and a gamma (graphs.state.context_for), not a plan
        (["--gates", "mur,bogus"], "mur experiment table1: --gates bogus: unknown gate 'bogus': "
         "choose one of never, always, mur, average, smart, first_token, random"),
        (["--gates", "mur,mur@0.5"], "mur experiment table1: --gates mur@0.5: gate label "
         "'mur@0.5': only random takes a rate (random@0.12)"),
        (["--gamma", "0"], "mur experiment table1: --gamma 0: gamma must be greater than 0, got "
         "0.0"),
        (["--sweep", "0.8,-1"], "mur experiment table1: --sweep -1: gamma must be greater than 0, "
         "got -1.0"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main([*args, "--dry-run"])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2
    assert capsys.readouterr().err == error + "\n"


def test_a_table_without_its_gpqa_file_stops_before_running_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not after hours of MATH-500 and AIME: the file is looked for first."""
    empty = tmp_path / "data"
    empty.mkdir()
    results = tmp_path / "results"
    assert main(["--preset", "paper-gpu", "--data-dir", str(empty), "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mur experiment table1: {empty / 'gpqa_diamond.jsonl.gz'} not found")
    assert err.count("\n") == 1 and "--data-dir DIR" in err
    assert not results.exists()


@pytest.mark.parametrize("dataset", PAPER_GPU.datasets, ids=lambda d: d.name)
def test_the_paper_preset_runs_whole_benchmarks(dataset: DatasetRun) -> None:
    """Its limits are the benchmarks' sizes (GPQA where a copy is found here)."""
    try:
        problems = load_dataset(dataset.name, limit=dataset.limit + 1)
    except DataNotFoundError as exc:
        pytest.skip(f"no copy of {dataset.name} here: {exc}")
    assert len(problems) == dataset.limit
    assert set(PRESETS) == {"paper-gpu", "cascade"}


def test_the_cascade_preset_writes_with_the_small_qwen3_and_rewrites_with_the_8b(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Qwen3-1.7B drafts, Qwen3-8B (its own server, port 8002) rewrites the flagged steps."""
    results = ["--results", str(tmp_path), "--data-dir", str(tmp_path / "gpqa")]
    assert main(["--preset", "cascade", "--dry-run", *results]) == 0
    out = capsys.readouterr().out
    commands = [line for line in out.splitlines() if line.startswith("mur solve ")]
    assert len(commands) == 4  # one strategy on each of the four benchmarks
    assert (
        "mur solve --strategy escalate --dataset math500 --limit 500 "
        "--gate never,always,mur,mur+bc,average,smart --gamma 0.9 "
        "--base-url http://127.0.0.1:8000/v1 --profile qwen3-1.7b "
        "--verifier-profile qwen3-8b-external"
    ) in commands[0]
    assert get_profile("qwen3-8b-external").port == 8002
    assert "# - escalate has no paper figure" in out
