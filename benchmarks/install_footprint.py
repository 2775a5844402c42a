"""What each install of the project costs: packages, megabytes, and the import of `ChatMUR`.

An app that only embeds the graph should not have to install the endpoint, the evaluations'
statistics and plots, or vLLM; pyproject.toml keeps a light base and puts the rest in extras.
This measures that split, so the claim stays a number (docs/install.md holds it):

- the wheel is built from a copy of the checkout, or from `git archive REV` (`--rev`,
  `--before`), which touches neither the working tree nor the repository's worktree list;
- each install goes into a fresh virtualenv made without pip (pip runs from outside with
  `--python`), so all its site-packages holds is what `pip install mur[extra]` added;
- the import is timed in a fresh interpreter (`-I`, from an empty folder, so the checkout's
  mur/ cannot shadow the installed one), round robin over every install once all are in, so
  the machine's load falls on each the same;
- the largest distributions are named with the requirement each comes through, so a heavy
  package the base still pulls in transitively shows up by name.

An extra the revision does not declare is reported as "—" with a note, not installed. pip
reads the machine's configuration (index, cache, constraints) as a user's pip would.
"""

from __future__ import annotations

import argparse
import datetime
import email
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import venv
import zipfile
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from mur.benchmarks.report import load_line
from mur.benchmarks.tables import markdown_table
from mur.servers.processes.facts import cpu_model

ROOT = Path(__file__).resolve().parents[1]
# What a checkout holds that is no part of a build (as tests/unit/test_wheel.py copies it).
NOT_BUILT = (
    ".git", ".venv", "results", "runs", "build", "dist", "*.egg-info", "__pycache__",
    ".mypy_cache", ".pytest_cache", ".ruff_cache", ".import_linter_cache",
)  # fmt: skip
HEAVY_MODULES = ("fastapi", "psycopg", "scipy", "sklearn", "matplotlib")
IMPORT = "from mur import ChatMUR, mur_tool"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
PIP_TIMEOUT_S = 1800
MB = 1e6

# Run inside the fresh environment: its site-packages, every distribution with its size on
# disk and its requirements, and which heavy modules are found. Standard library only.
INSPECT = """
import importlib.metadata as md, importlib.util, json, os, sys, sysconfig
paths = sysconfig.get_paths()
dists = []
for dist in md.distributions():
    size = 0
    for file in dist.files or ():
        try:
            size += os.lstat(dist.locate_file(file)).st_blocks * 512
        except OSError:
            pass
    dists.append({"name": dist.metadata["Name"], "version": dist.version, "bytes": size,
                  "requires": dist.requires or []})
found = {name: importlib.util.find_spec(name) is not None for name in sys.argv[1:]}
print(json.dumps({"site": sorted({paths["purelib"], paths["platlib"]}), "dists": dists,
                  "found": found}))
"""
# The import, timed inside the interpreter; then how many modules it left loaded and which
# of the heavy ones (a heavy package installed is a cost on disk, imported a cost every start).
TIMED = f"""
import sys, time
t = time.perf_counter()
{IMPORT}
s = time.perf_counter() - t
print(s, len(sys.modules), *sorted({{m.split(".")[0] for m in sys.modules}} & set(sys.argv[1:])))
"""


class FootprintError(Exception):
    """A step that failed (a build, an install, a git revision): one line for the user."""


@dataclass
class Footprint:
    """One install's measurements; `packages` is None for an extra the revision lacks."""

    install: str
    source: str  # what was built: `working tree` or a git revision with its commit
    packages: int | None = None
    mb: float | None = None
    mur_mb: float | None = None
    import_s: list[float] = field(default_factory=list)
    modules: int | None = None  # in sys.modules after the import
    loaded: list[str] = field(default_factory=list)  # heavy modules the import loaded
    found: dict[str, bool] = field(default_factory=dict)
    note: str = ""
    distributions: list[dict[str, Any]] = field(default_factory=list)  # largest first
    load: str = ""  # the load average when its imports were timed

    @property
    def import_median(self) -> float | None:
        return statistics.median(self.import_s) if self.import_s else None


def install_name(extras: tuple[str, ...]) -> str:
    return "+".join(extras) or "base"


def run(command: Sequence[str], what: str, **kwargs: Any) -> str:
    """Run a command; its stdout, or a FootprintError naming `what` and its last stderr line."""
    done = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise FootprintError(f"{what} failed (exit {done.returncode}): {(lines or ['?'])[-1]}")
    return done.stdout


def source_tree(source: Path, rev: str | None, work: Path) -> Path:
    """A copy of the project to build: the checkout as it is, or `git archive REV` of it (the
    archive keeps mur/'s symbolic links, which the build follows)."""
    tree = work / "source"
    if rev is None:
        shutil.copytree(source, tree, symlinks=True, ignore=shutil.ignore_patterns(*NOT_BUILT))
        return tree
    tar = work / "source.tar"
    run(["git", "-C", str(source), "archive", "-o", str(tar), rev], f"git archive {rev}")
    with tarfile.open(tar) as archive:
        archive.extractall(tree, filter="data")
    return tree


def build_wheel(tree: Path, work: Path) -> Path:
    """The project's wheel, built with this environment's setuptools (no isolation, no deps)."""
    dist = work / "dist"
    command = [*PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(tree)]
    run(command, "building the wheel", timeout=PIP_TIMEOUT_S)
    wheels = sorted(dist.glob("mur-*.whl"))
    if len(wheels) != 1:
        raise FootprintError(f"expected one mur wheel in {dist}, found {len(wheels)}")
    return wheels[0]


def wheel_extras(wheel: Path) -> set[str]:
    """The extras the wheel's METADATA declares (Provides-Extra)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(archive.read(name))
    return {extra.strip() for extra in metadata.get_all("Provides-Extra") or ()}


def site_bytes(folders: Sequence[str]) -> int:
    """Bytes on disk under the folders, as `du` counts them (blocks, links not followed)."""
    total = 0
    for folder in dict.fromkeys(folders):
        for parent, _, files in os.walk(folder):
            for name in files:
                total += os.lstat(os.path.join(parent, name)).st_blocks * 512
    return total


def requirement_names(requires: Sequence[str], extras: tuple[str, ...]) -> list[str]:
    """The names a distribution requires in this environment with these extras chosen."""
    names: list[str] = []
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is not None and not any(
            req.marker.evaluate({"extra": extra}) for extra in (*extras, "")
        ):
            continue
        names.append(canonicalize_name(req.name))
    return names


def chains(dists: Sequence[dict[str, Any]], extras: tuple[str, ...]) -> dict[str, list[str]]:
    """For each installed distribution, the shortest chain of requirements from mur to it
    (breadth first over what is installed; mur's own requirements read with `extras`)."""
    by_name: dict[str, dict[str, Any]] = {canonicalize_name(d["name"]): d for d in dists}
    path: dict[str, list[str]] = {"mur": []}
    queue = deque(["mur"])
    while queue:
        name = queue.popleft()
        wanted = extras if name == "mur" else ()
        for child in requirement_names(by_name[name]["requires"], wanted):
            if child in by_name and child not in path:
                path[child] = [*path[name], child]
                queue.append(child)
    return path


def described(dists: Sequence[dict[str, Any]], extras: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every distribution but mur, largest first: name, version, MB and the chain of
    requirements from mur that installed it."""
    path = chains(dists, extras)
    ranked = sorted(
        (d for d in dists if canonicalize_name(d["name"]) != "mur"), key=lambda d: -d["bytes"]
    )
    return [
        {
            "name": d["name"],
            "version": d["version"],
            "mb": round(d["bytes"] / MB, 2),
            "via": path.get(canonicalize_name(d["name"]), ["?"]),
        }
        for d in ranked
    ]


def time_imports(envs: Sequence[tuple[Footprint, Path, Path]], runs: int) -> None:
    """Time `IMPORT` in every environment, round robin (one warm-up round discarded), so a
    change in the machine's load falls on every install alike; `envs` holds each install's
    footprint, its python, and an empty folder to run in."""
    for footprint, _, _ in envs:
        footprint.load = load_line()
    for round_ in range(runs + 1):
        for footprint, python, cwd in envs:
            env = {"PATH": f"{python.parent}:/usr/bin:/bin", "HOME": str(cwd)}
            command = [str(python), "-I", "-c", TIMED, *HEAVY_MODULES]
            what = f"`{IMPORT}` in {footprint.install} ({footprint.source})"
            seconds, modules, *loaded = run(command, what, cwd=cwd, env=env, timeout=300).split()
            if round_:
                footprint.import_s.append(float(seconds))
            footprint.modules, footprint.loaded = int(modules), loaded


def measure(
    wheel: Path, extras: tuple[str, ...], source: str, work: Path, args: argparse.Namespace
) -> tuple[Footprint, Path, Path]:
    """Install the wheel with `extras` into a fresh venv and measure what it holds; the
    footprint, the venv's python and an empty folder to time the import from."""
    name = install_name(extras)
    env_dir = work / f"env-{name}"
    venv.EnvBuilder(with_pip=False, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    target = f"{wheel}[{','.join(extras)}]" if extras else str(wheel)
    run([*PIP, "--python", str(python), "install", target], f"pip install of {name}",
        timeout=PIP_TIMEOUT_S)  # fmt: skip
    empty = work / f"cwd-{name}"
    empty.mkdir(exist_ok=True)
    inspected = json.loads(
        run([str(python), "-I", "-c", INSPECT, *HEAVY_MODULES], f"inspecting {name}", cwd=empty)
    )
    dists = inspected["dists"]
    mur = [d for d in dists if canonicalize_name(d["name"]) == "mur"]
    footprint = Footprint(
        install=name,
        source=source,
        packages=len(dists) - len(mur),
        mb=site_bytes(inspected["site"]) / MB,
        mur_mb=sum(d["bytes"] for d in mur) / MB,
        found=inspected["found"],
        distributions=described(dists, extras),
    )
    return footprint, python, empty


def source_label(source: Path, rev: str | None) -> str:
    """`working tree`, or the revision with its short commit: `HEAD (428486f)`."""
    if rev is None:
        return "working tree"
    commit = run(["git", "-C", str(source), "rev-parse", "--short", rev], f"git rev-parse {rev}")
    return f"{rev} ({commit.strip()})"


def header(args: argparse.Namespace, command: str) -> list[str]:
    """What was measured, on what, when."""
    pip_version = run([sys.executable, "-m", "pip", "--version"], "pip --version").split()[1]
    return [
        f"# Install footprint of mur ({args.source})",
        "",
        f"- Command: `{command}`",
        f"- Date: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        f"- CPU: {cpu_model()}, {len(os.sched_getaffinity(0))} cores usable; load average "
        f"{load_line()} at the start",
        f"- Python {platform.python_version()}, pip {pip_version}",
        f"- Import time: `{IMPORT}`, median of {args.runs} fresh interpreters",
    ]


def table(footprints: Sequence[Footprint]) -> str:
    def cell(value: float | None, digits: int) -> str:
        return "—" if value is None else f"{value:.{digits}f}"

    rows = [
        [
            f.source,
            f.install,
            "—" if f.packages is None else f.packages,
            cell(f.mb, 0),
            cell(f.import_median, 2),
        ]
        for f in footprints
    ]
    return markdown_table(["source", "install", "packages", "MB", "import s"], rows)


def via(chain: Sequence[str]) -> str:
    """How a distribution got installed: `direct`, or `via a > b` (mur's requirement first)."""
    return "direct" if len(chain) <= 1 else f"via {' > '.join(chain[:-1])}"


def details(footprints: Sequence[Footprint], top: int) -> list[str]:
    """Per install: its note, or what the table leaves out (the import's spread, what it
    loaded, what it adds to its source's base, its `top` largest packages)."""
    bases = {f.source: f for f in footprints if f.install == "base" and f.packages is not None}
    lines = []
    for f in footprints:
        if f.packages is None:
            lines.append(f"- {f.install} ({f.source}): {f.note}")
            continue
        found = ", ".join(f"{m} {'present' if ok else 'absent'}" for m, ok in f.found.items())
        big = "; ".join(
            f"{d['name']} {d['mb']:.0f} MB ({via(d['via'])})" for d in f.distributions[:top]
        )
        spread = f"{min(f.import_s):.2f}-{max(f.import_s):.2f} s" if f.import_s else "-"
        heavy = ", ".join(f.loaded) or "none of the heavy ones"
        line = (
            f"- {f.install} ({f.source}): mur itself {f.mur_mb:.1f} MB of it; import {spread}, "
            f"{f.modules} modules loaded ({heavy}); {found}; largest: {big}"
        )
        base = bases.get(f.source)
        if base is not None and base is not f:
            had = {d["name"] for d in base.distributions}
            added = [
                f"{d['name']} ({via(d['via'])})" for d in f.distributions if d["name"] not in had
            ]
            line += f"; adds to base: {', '.join(sorted(added, key=str.lower)) or 'nothing'}"
        lines.append(line)
    return lines


def measure_source(
    args: argparse.Namespace, rev: str | None, work: Path
) -> list[tuple[Footprint, Path | None, Path | None]]:
    """Build one source's wheel, then install and inspect each install in turn (progress on
    stderr): each footprint with its venv's python and folder (None for a missing extra)."""
    work.mkdir()
    label = source_label(args.source, rev)
    wheel = build_wheel(source_tree(args.source, rev, work), work)
    declared = wheel_extras(wheel)
    measured: list[tuple[Footprint, Path | None, Path | None]] = []
    for extras in dict.fromkeys(args.installs):
        name = install_name(extras)
        missing = sorted(set(extras) - declared)
        if missing:
            note = f"no extra {', '.join(missing)} here (extras: {', '.join(sorted(declared))})"
            measured.append((Footprint(name, label, note=note), None, None))
        else:
            measured.append(measure(wheel, extras, label, work, args))
        footprint = measured[-1][0]
        print(f"{label}, {name}: {footprint.note or footprint.packages}", file=sys.stderr)
    return measured


def measure_all(args: argparse.Namespace, work: Path) -> list[Footprint]:
    """Measure `--before`'s installs (if given), then the measured source's, then time every
    import across both, round robin."""
    measured = []
    if args.before:
        measured += measure_source(args, args.before, work / "before")
    measured += measure_source(args, args.rev, work / "after")
    envs = [(f, python, cwd) for f, python, cwd in measured if python and cwd]
    time_imports(envs, args.runs)
    return [f for f, _, _ in measured]
