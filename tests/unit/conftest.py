"""Fixtures of the unit tests."""

from __future__ import annotations

import pytest

from mur.evals.harness.progress import RunProgress


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
