"""The extras: what pyproject.toml installs for each is what nodes.extras checks for, and a
feature whose extra is missing is one line naming it (the base install itself:
tests/unit/test_wheel.py)."""

from __future__ import annotations

import importlib.util
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from mur.nodes import extras
from mur.nodes.extras import EXTRA_MODULES, MissingExtra, require

ROOT = Path(__file__).resolve().parents[2]


def modules_of(distribution: str) -> set[str]:
    """The packages and modules a distribution installs, dotted (`psycopg.rows`)."""
    found = set()
    for file in metadata.distribution(distribution).files or []:
        if file.suffix == ".py" and file.parts[0] != ".." and "-" not in file.parts[0]:
            parts = file.with_suffix("").parts
            found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


@pytest.mark.parametrize("extra", sorted(EXTRA_MODULES))
def test_each_extra_checks_a_module_of_every_package_it_installs(extra: str) -> None:
    """Every module `require(extra)` looks for comes from a package of that extra, and every
    package of the extra has one looked for: the two lists cannot drift apart."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    packages = [Requirement(line).name for line in project["optional-dependencies"][extra]]
    provided = {name: modules_of(name) for name in packages}
    checked = set(EXTRA_MODULES[extra])
    unchecked = [name for name, modules in provided.items() if not modules & checked]
    assert not unchecked, f"{extra}: no module of {unchecked} in nodes.extras.EXTRA_MODULES"
    stray = checked - set().union(*provided.values())
    assert not stray, f"{extra}: {sorted(stray)} come from no package of the extra"


def test_a_missing_module_names_the_extra_and_the_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        extras.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "sklearn" else real(name, *a),
    )
    with pytest.raises(MissingExtra) as missing:
        require("lab", "foresight's clustering")
    assert str(missing.value) == (
        "foresight's clustering needs the 'lab' extra, which this install lacks (no module "
        "'sklearn'): pip install 'mur[lab]'"
    )
    require("serve", "the endpoint")  # installed here: no error
    with pytest.raises(ValueError, match="unknown extra 'gpu': choose one of serve, lab"):
        require("gpu", "x")
