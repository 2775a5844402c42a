"""docs/examples/*.py loaded as modules (they are scripts, not a package), for their tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"


def example(name: str) -> ModuleType:
    """docs/examples/<name>.py, imported."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
