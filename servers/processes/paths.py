"""Where servers/ keeps its state: one root folder, MUR_HOME, so a user can find and wipe it."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = Path("~/.cache/mur")


def mur_home() -> Path:
    """Root of MUR's local state: `$MUR_HOME`, else `~/.cache/mur` (not created here)."""
    raw = os.environ.get("MUR_HOME", "").strip()
    return Path(raw).expanduser() if raw else DEFAULT_HOME.expanduser()


def models_dir(home: Path | None = None) -> Path:
    """Converted models live here (`<MUR_HOME>/models`)."""
    return (home or mur_home()) / "models"


def logs_dir(home: Path | None = None) -> Path:
    """One log per profile (`<MUR_HOME>/logs/<profile>.log`), overwritten at each start."""
    return (home or mur_home()) / "logs"


def run_dir(home: Path | None = None) -> Path:
    """One JSON record per server this package started (`<MUR_HOME>/run/<profile>.json`)."""
    return (home or mur_home()) / "run"


def vllm_cache_dir(home: Path | None = None) -> Path:
    """vLLM's own caches (compiled kernels, torch.compile artefacts), kept inside MUR_HOME."""
    return (home or mur_home()) / "vllm-cache"
