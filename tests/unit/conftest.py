"""Fixtures of the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

from mur.evals.harness.progress import RunProgress

# Hypothesis fails an example that runs over its `deadline` (200 ms unless a test says): a
# wall time, which a machine three times slower or a loaded one breaks. Examples run without
# one; each test's own time limit (pyproject's `timeout`) still ends one that hangs.
settings.register_profile("mur", deadline=None)
settings.load_profile("mur")


@pytest.fixture
def mur_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A MUR_HOME of the test's own: no records, logs or models leak between tests, and the
    machine's own servers are out of reach (a module takes it for every test with
    `pytestmark = pytest.mark.usefixtures("mur_home")`)."""
    home = tmp_path / "mur-home"
    monkeypatch.setenv("MUR_HOME", str(home))
    return home


@pytest.fixture
def runner_progress(monkeypatch: pytest.MonkeyPatch) -> list[RunProgress]:
    """Each RunProgress the benchmark runner makes from here on, so a test can read what the
    runner told it; `priced_at_start` is its `tokens_left()` when it was made."""
    made: list[RunProgress] = []

    class Watched(RunProgress):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.priced_at_start = self.tokens_left()
            made.append(self)

    monkeypatch.setattr("mur.evals.harness.runner.RunProgress", Watched)
    return made


@pytest.fixture(scope="session")
def _checkpoints_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("endpoint-checkpoints")


@pytest.fixture(autouse=True)
def _endpoint_checkpoints_in_a_temporary_folder(
    _checkpoints_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An endpoint started by a test (`main`, or `python -m mur endpoint` in a subprocess)
    checkpoints in a temporary file, not in the user's MUR_HOME."""
    monkeypatch.setenv("MUR_CHECKPOINTER", str(_checkpoints_folder / "checkpoints.sqlite"))
