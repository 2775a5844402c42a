"""Which servers made a folder's runs: facts recorded in settings.json, a resume on a server
whose tokens differ refused in one line (or recorded as a mix), questions in flight measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from faulty_server import faulty_server
from mur.evals.harness.provenance import ServerMixError, record_servers, served_by
from mur.evals.harness.records import RecordStore
from mur.servers.processes.facts import flag_value, served_weights, token_differences
from mur.servers.processes.launcher import served_dtype
from mur.servers.processes.throughput import StreamRate, choose

ROOT = Path(__file__).resolve().parents[2]


def facts(dtype: str = "bfloat16", version: str = "0.32.0", cpu: str = "AMD EPYC") -> dict:
    return {
        "base_url": "http://127.0.0.1:8021/v1",
        "model": "m",
        "vllm_version": version,
        "dtype": dtype,
        "logprobs_mode": "raw_logprobs",
        "cpu": cpu,
        "cpu_flags": ["avx2"],
    }


def entry(**kwargs: str) -> dict:
    return {"backbone": facts(**kwargs), "verifier": facts(**kwargs), "concurrency": 16}


def test_flag_value_reads_both_spellings() -> None:
    argv = ["python", "-m", "vllm", "--dtype", "bfloat16", "--logprobs-mode=raw_logprobs"]
    assert flag_value(argv, "--dtype") == "bfloat16"
    assert flag_value(argv, "--logprobs-mode") == "raw_logprobs"
    assert flag_value(argv, "--port") is None


def test_only_known_token_facts_count_as_differences() -> None:
    assert token_differences(facts(), facts(cpu="Intel Xeon")) == []  # same dtype elsewhere
    assert token_differences(facts(), facts(dtype="float32")) == ["dtype"]
    assert token_differences(facts(), {**facts(), "vllm_version": None}) == []  # unknown
    int8 = {**facts(), "weights": "w8a8"}
    assert token_differences({**facts(), "weights": "bf16"}, int8) == ["weights"]
    assert token_differences(facts(), int8) == []  # folders recorded before formats: no claim


def test_the_weight_format_comes_from_the_served_folders_manifest(tmp_path: Path) -> None:
    folder = tmp_path / "Model-w8a8"
    folder.mkdir()
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    assert served_weights(argv) is None  # no manifest: not a folder the project made
    (folder / "mur-manifest.json").write_text(json.dumps({"weights": "w8a8"}))
    assert served_weights(argv) == "w8a8"
    (folder / "mur-manifest.json").write_text(json.dumps({"format": 1}))
    assert served_weights(argv) == "bf16"  # made before formats existed
    assert served_weights(["vllm", "--model", "Qwen/Qwen3-8B"]) is None
    assert served_weights(None) is None


def test_the_fewest_streams_near_the_best_throughput_are_chosen() -> None:
    rates = [StreamRate(8, 50.0), StreamRate(16, 95.0), StreamRate(32, 100.0), StreamRate(64, 98)]
    assert choose(rates) == 16
    assert choose(rates, near_best=1.0) == 32


def test_servers_are_recorded_once_and_a_change_of_dtype_is_refused(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    record_servers(store, entry(), allow_mixed=False)
    record_servers(store, entry(), allow_mixed=False)  # same servers: no second entry
    record_servers(store, entry(cpu="Intel Xeon"), allow_mixed=False)  # same tokens, new CPU
    history = json.loads((tmp_path / "settings.json").read_text())["servers"]
    assert [h["backbone"]["cpu"] for h in history] == ["AMD EPYC", "Intel Xeon"]
    with pytest.raises(ServerMixError) as refused:
        record_servers(store, entry(dtype="float32"), allow_mixed=False)
    message = str(refused.value)
    assert "\n" not in message
    assert "dtype='bfloat16'" in message and "dtype='float32'" in message
    assert "--allow-mixed-servers" in message
    record_servers(store, entry(dtype="float32"), allow_mixed=True)
    history = json.loads((tmp_path / "settings.json").read_text())["servers"]
    assert [h["mixed"] for h in history] == [False, False, True]
    served = served_by(tmp_path)  # what the folder's reports say served it
    assert served[0] == "from run 0: vLLM 0.32.0, bfloat16 on AMD EPYC (backbone and verifier)"
    assert "float32" in served[2] and "MIX" in served[2] and "MIX" not in served[1]
    (tmp_path / "settings.json").write_text("{not json")  # edited by hand: said, not hidden
    assert served_by(tmp_path)[0].startswith(f"unknown: {tmp_path / 'settings.json'} is unreadable")
    assert served_by(tmp_path / "nowhere") == []  # no settings.json: nothing recorded


def _claim_server(home: Path, base_url: str, dtype: str) -> None:
    """A launcher record saying this (live) test process serves `base_url` in `dtype`."""
    run = home / "run"
    run.mkdir(parents=True)
    record = {
        "profile": "fake",
        "pid": os.getpid(),
        "create_time": psutil.Process().create_time(),
        "base_url": base_url,
        "argv": ["vllm", "--dtype", dtype, "--logprobs-mode", "raw_logprobs"],
    }
    (run / "fake.json").write_text(json.dumps(record))


def test_run_py_refuses_to_resume_on_another_dtype_in_one_line(tmp_path: Path, test_data) -> None:
    out = tmp_path / "folder"
    out.mkdir()
    recorded = {"backbone": facts(dtype="bfloat16", version=None), "concurrency": 1}
    recorded["backbone"]["base_url"] = "recorded"
    (out / "settings.json").write_text(json.dumps({"servers": [recorded]}))
    with faulty_server(["step", "ok"]) as server:
        _claim_server(tmp_path / "home", server.base_url, "float32")
        command = [
            sys.executable, "run.py", "--strategy", "critic", "--gate", "never",
            "--dataset", "math500", "--data-dir", str(test_data), "--limit", "1",
            "--base-url", server.base_url, "--concurrency", "1", "--out", str(out),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("MUR_")}
        env["MUR_HOME"] = str(tmp_path / "home")
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().count("\n") == 0, done.stderr
        assert "dtype='bfloat16'" in done.stderr and "dtype='float32'" in done.stderr
        assert server.requests == 0  # refused before any question was sent

        done = subprocess.run(
            [*command, "--allow-mixed-servers"], cwd=ROOT, capture_output=True, text=True, env=env
        )
    assert done.returncode == 0, done.stderr
    history = json.loads((out / "settings.json").read_text())["servers"]
    assert history[-1]["mixed"] is True and history[-1]["backbone"]["dtype"] == "float32"
    assert history[-1]["concurrency_chosen_by"] == "--concurrency"


def test_the_dtype_comes_from_the_command_line_and_auto_when_it_gives_none() -> None:
    """One reading for `mur servers status` and the run folders' settings.json."""
    assert served_dtype(["vllm", "--model", "m", "--dtype", "bfloat16"]) == "bfloat16"
    assert served_dtype(["vllm", "--model", "m"]) == "auto"
    assert served_dtype(None) is None
