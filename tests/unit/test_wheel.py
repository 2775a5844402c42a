"""What a user installs: a wheel of the project puts one package, `mur`, into site-packages.

The wheel is built from a copy of the checkout (so the test leaves no build/ or egg-info behind)
and installed into a fresh virtualenv without pip's dependency resolution; the dependencies come
from this environment through a .pth line appended after the fresh site-packages, so `mur` can
only come from the wheel. There the README's embedding imports and the embedding test's parent
graph run against the scripted fake model, and the `mur` command answers --help.
"""

from __future__ import annotations

import email.parser
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from mur.cli.registry import MUR
from mur.nodes.extras import EXTRA_MODULES

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
# What a checkout holds that is no part of a build.
NOT_BUILT = (
    ".git",
    ".venv",
    "results",
    "runs",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".import_linter_cache",
)


def readme_embedding_imports() -> str:
    """The import lines of the README's embedding example, as a user copies them."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Embedding the graph", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code, "README's embedding section has no python example"
    imports = [line for line in code[1].splitlines() if line.startswith(("from ", "import "))]
    assert any("mur" in line for line in imports), imports
    return "\n".join(imports)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built from a copy of the checkout."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(*NOT_BUILT))
    subprocess.run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), str(source)],
        check=True,
        timeout=600,
    )
    (built,) = (work / "dist").glob("mur-*.whl")
    return built


def fresh_env(wheel: Path, where: Path) -> tuple[Path, Path]:
    """(python, site-packages) of a new virtualenv at `where` holding the wheel alone."""
    venv.EnvBuilder(with_pip=False).create(where)
    python = where / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    before = {path.name for path in site.iterdir()}
    subprocess.run(
        [*PIP, "--python", str(python), "install", "--no-deps", str(wheel)], check=True, timeout=600
    )
    added = {path.name for path in site.iterdir()} - before
    packages = {name for name in added if not name.endswith(".dist-info")}
    assert packages == {"mur"}, f"the wheel put {sorted(added)} into site-packages"
    return python, site


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the fresh environment's python, its site-packages) with the project's wheel installed,
    every dependency of every extra beside it."""
    python, site = fresh_env(wheel, tmp_path_factory.mktemp("full") / "env")
    # The dependencies, after the fresh site-packages (a .pth line appends its folder).
    (site / "zz-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, site


def base_distributions(wheel: Path) -> set[str]:
    """What `pip install mur` brings: the wheel's requirements outside any extra, and theirs
    (with the extras they ask for), as this environment installed them."""
    with zipfile.ZipFile(wheel) as whl:
        name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        headers = email.parser.Parser().parsestr(whl.read(name).decode())
    seen: set[tuple[str, str]] = set()  # (distribution, extra asked of it)
    todo = [(Requirement(line), "") for line in headers.get_all("Requires-Dist") or []]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        key = canonicalize_name(requirement.name)
        for asked in {"", *requirement.extras}:
            if (key, asked) not in seen:
                seen.add((key, asked))
                lines = metadata.requires(requirement.name) or []
                todo.extend((Requirement(line), asked) for line in lines)
    return {name for name, _ in seen}


def link_files(names: set[str], farm: Path) -> None:
    """Each file of each distribution named, linked into `farm` at its place in site-packages
    (file by file: a namespace such as langgraph/ holds files of base and extra packages)."""
    for name in names:
        dist = metadata.distribution(name)
        for file in dist.files or []:
            if file.parts[0] == ".." or "__pycache__" in file.parts:
                continue
            target = Path(str(dist.locate_file(file)))
            if target.exists():
                link = farm / file
                link.parent.mkdir(parents=True, exist_ok=True)
                if not link.exists():
                    link.symlink_to(target)


@pytest.fixture(scope="module")
def light(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a fresh environment with the wheel and only what `pip install mur`
    brings (no extra): the base dependencies' files linked into a folder of their own."""
    work = tmp_path_factory.mktemp("light")
    python, site = fresh_env(wheel, work / "env")
    link_files(base_distributions(wheel), work / "dependencies")
    (site / "zz-dependencies.pth").write_text(f"{work / 'dependencies'}\n")
    return python


def test_the_base_install_embeds_without_any_extra(light: Path, tmp_path: Path) -> None:
    """`pip install mur`: no module of the serve or lab extras, and ChatMUR, mur_tool and
    MURMiddleware work (ChatMUR over the scripted model)."""
    extras = [module for modules in EXTRA_MODULES.values() for module in modules]
    code = f"""
import importlib.util, sys
def found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
present = [m for m in {extras!r} if found(m)]
assert not present, f"the base install has {{present}}"
from mur import ChatMUR, MURMiddleware, mur_tool
from fakes import two_step_model
chat = ChatMUR(backbone=two_step_model(), strategy="critic", gate="never")
assert chat.invoke("What is 3 + 4?").response_metadata["answer"] == "7"
assert mur_tool(chat).name == "mur_reason" and MURMiddleware
print("light", sorted(m for m in sys.modules if m.split(".")[0] in ("scipy", "fastapi")))
"""
    assert run_in(light, code, tmp_path).split() == ["light", "[]"]


def test_each_command_runs_or_names_its_extra_in_the_base_install(
    light: Path, tmp_path: Path
) -> None:
    """Every command without an extra in the registry answers --help in the base install;
    every command with one says in one line which extra to install (exit 1). So does a base
    command's feature that needs one (`mur solve --dataset`)."""
    asked = [(words, command.extra) for words, command in MUR.leaves()]
    asked.append(("mur solve --strategy critic --dataset math500", "lab"))
    for words, extra in asked:
        arguments = words.split()[1:] + ([] if extra else ["--help"])
        done = subprocess.run(
            [str(light.parent / "mur"), *arguments],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )
        if not extra:
            assert done.returncode == 0, (words, done.stderr[-2000:])
            continue
        lines = done.stderr.splitlines()
        assert done.returncode == 1 and len(lines) == 1, (words, done.stderr[-2000:])
        assert f"needs the '{extra}' extra" in lines[0], lines
        assert lines[0].endswith(f"pip install 'mur[{extra}]'"), lines


def run_in(python: Path, code: str, cwd: Path) -> str:
    """Run `code` in the fresh environment from `cwd` (never the checkout, whose mur/ would
    shadow the installed one), with only the tests' fake model on the path."""
    fakes = cwd / "fakes"
    fakes.mkdir(exist_ok=True)
    shutil.copy(TESTS / "fakes.py", fakes / "fakes.py")
    done = subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={"PATH": f"{python.parent}:/usr/bin:/bin", "PYTHONPATH": str(fakes)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_wheel_installs_one_package_that_embeds(installed, tmp_path: Path) -> None:
    python, site = installed
    embedding = (TESTS / "unit" / "test_embedding.py").read_text()
    code = f"""
{readme_embedding_imports()}
import asyncio, mur, mur.graphs
assert mur.__file__.startswith({str(site)!r}), mur.__file__
assert mur.graphs.__file__.startswith({str(site)!r}), mur.graphs.__file__
{embedding.replace("from __future__ import annotations", "")}
asyncio.run(test_mur_graph_embeds_in_a_parent_graph_with_its_own_state())
from mur import ChatMUR, mur_tool
from fakes import two_step_model
chat = ChatMUR(backbone=two_step_model(), strategy="critic", gate="never")
reply = chat.invoke("What is 3 + 4?")
assert reply.response_metadata["answer"] == "7", reply.content
assert mur_tool(chat).name == "mur_reason"
print("embedded", mur.__file__)
"""
    assert "embedded" in run_in(python, code, tmp_path)


def test_the_wheel_installs_the_mur_command(installed, tmp_path: Path) -> None:
    python, _ = installed
    done = subprocess.run(
        [str(python.parent / "mur"), "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "solve" in done.stdout and "servers" in done.stdout


def test_every_installed_command_answers_help_and_every_module_imports(
    installed, tmp_path: Path
) -> None:
    """In the fresh environment, with no tests/ on the path: each subcommand of the registry
    answers --help (exit 0, its own usage line), and every module the wheel ships imports (a
    module that imports what the wheel does not ship fails here). One interpreter for all."""
    python, site = installed
    code = f"""
import contextlib, importlib, io, pkgutil, sys, mur
from mur.cli import main
assert mur.__file__.startswith({str(site)!r}), mur.__file__
for words in {leaves()!r}:
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        try:
            main([*words.split()[1:], "--help"])
        except SystemExit as exc:
            assert exc.code in (0, None), (words, exc.code)
    assert f"usage: {{words}}" in shown.getvalue(), words
found = pkgutil.walk_packages(mur.__path__, "mur.")
names = [m.name for m in found if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
assert not any(m == "tests" or m.startswith("tests.") or m == "fakes" for m in sys.modules)
print(len(names), "modules")
"""
    done = subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={"PATH": f"{python.parent}:/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[0]) > 100


def leaves() -> list[str]:
    """Every runnable command's words (`mur bench chaos`)."""
    return [words for words, _ in MUR.leaves()]
