"""What a user installs: a wheel of the project puts one package, `mur`, into site-packages.

The wheel is built from a copy of the checkout (so the test leaves no build/ or egg-info behind)
and installed into a fresh virtualenv without pip's dependency resolution; the dependencies come
from this environment through a .pth line appended after the fresh site-packages, so `mur` can
only come from the wheel. There the README's embedding imports and the embedding test's parent
graph run against the scripted fake model, and the `mur` command answers --help.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from mur.cli.registry import MUR

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
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
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the fresh environment's python, its site-packages) with the project's wheel installed."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(*NOT_BUILT))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), str(source)],
        check=True,
        timeout=600,
    )
    (wheel,) = (work / "dist").glob("mur-*.whl")
    env_dir = work / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
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
        [*pip, "--python", str(python), "install", "--no-deps", str(wheel)], check=True, timeout=600
    )
    added = {path.name for path in site.iterdir()} - before
    packages = {name for name in added if not name.endswith(".dist-info")}
    assert packages == {"mur"}, f"the wheel put {sorted(added)} into site-packages"
    # The dependencies, after the fresh site-packages (a .pth line appends its folder).
    (site / "zz-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, site


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
