"""Serving layer, in two rooms: what talks to a model server (`servers.clients`: chat models,
the session header, probes, metrics, transport errors) and what runs one (`servers.processes`:
launcher, pid records, replicas, profiles, the embedded model). `servers.connect` bridges them
for the entry points: clients from flags or the environment, the embedded server started when
no URL is given. Knows nothing of reasoning or benchmarks; everything hardware-specific (the
CPU build, the embedded PyPI model) stays in `servers.processes`. Typical use:

    from mur.servers import make_chat_model
    backbone = make_chat_model("http://127.0.0.1:8022/v1")   # a client of a running server

    from mur.servers.connect import connect
    clients = connect(start=True)    # from flags, MUR_BASE_URL..., or the embedded server
    clients.backbone, clients.verifier               # LangChain chat models for the graph
    with session("run-1/question-7"):            # X-Session-ID: sticky behind vllm-router
        ...

The names below are imported on first use, so importing one module of the clients side (as
graphs/ does) loads nothing of the processes side.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mur.servers.clients.chat_models import (
        SAMPLING_DEFAULTS,
        RequestTimeout,
        VLLMChatOpenAI,
        make_chat_model,
        resolve_model,
    )
    from mur.servers.clients.environment import clients_from_env
    from mur.servers.clients.errors import (
        ModelError,
        ServerError,
        ServerStopped,
        ServerUnavailable,
    )
    from mur.servers.clients.metrics import generation_tokens, prompt_tokens, read_counter
    from mur.servers.clients.probes import (
        check_endpoint,
        check_single_url,
        normalize_base_url,
        root_url,
    )
    from mur.servers.clients.sessions import SESSION_HEADER, new_session_id, session
    from mur.servers.connect import Connection
    from mur.servers.processes.launcher import RunningServer, down, status, up
    from mur.servers.processes.model import ensure_tiny_model, tiny_model_dir, verify_model_dir
    from mur.servers.processes.paths import mur_home
    from mur.servers.processes.profiles import (
        DEFAULT_PROFILE,
        EMBEDDED_MODEL,
        Profile,
        command_line,
        get_profile,
        profiles,
    )

# Where each public name lives: imported from there on first use.
_MODULES = {
    "mur.servers.clients.chat_models": (
        "SAMPLING_DEFAULTS",
        "RequestTimeout",
        "VLLMChatOpenAI",
        "make_chat_model",
        "resolve_model",
    ),
    "mur.servers.clients.environment": ("clients_from_env",),
    "mur.servers.clients.errors": (
        "ModelError",
        "ServerError",
        "ServerStopped",
        "ServerUnavailable",
    ),
    "mur.servers.clients.metrics": ("generation_tokens", "prompt_tokens", "read_counter"),
    "mur.servers.clients.probes": (
        "check_endpoint",
        "check_single_url",
        "normalize_base_url",
        "root_url",
    ),
    "mur.servers.clients.sessions": ("SESSION_HEADER", "new_session_id", "session"),
    "mur.servers.connect": ("Connection",),
    "mur.servers.processes.launcher": ("RunningServer", "down", "status", "up"),
    "mur.servers.processes.model": ("ensure_tiny_model", "tiny_model_dir", "verify_model_dir"),
    "mur.servers.processes.paths": ("mur_home",),
    "mur.servers.processes.profiles": (
        "DEFAULT_PROFILE",
        "EMBEDDED_MODEL",
        "Profile",
        "command_line",
        "get_profile",
        "profiles",
    ),
}
_PUBLIC = {name: module for module, names in _MODULES.items() for name in names}

__all__ = [
    "DEFAULT_PROFILE",
    "EMBEDDED_MODEL",
    "SAMPLING_DEFAULTS",
    "SESSION_HEADER",
    "Connection",
    "ModelError",
    "Profile",
    "RequestTimeout",
    "RunningServer",
    "ServerError",
    "ServerStopped",
    "ServerUnavailable",
    "VLLMChatOpenAI",
    "check_endpoint",
    "check_single_url",
    "clients_from_env",
    "command_line",
    "down",
    "ensure_tiny_model",
    "generation_tokens",
    "get_profile",
    "make_chat_model",
    "mur_home",
    "new_session_id",
    "normalize_base_url",
    "profiles",
    "prompt_tokens",
    "read_counter",
    "resolve_model",
    "root_url",
    "session",
    "status",
    "tiny_model_dir",
    "up",
    "verify_model_dir",
]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'mur.servers' has no attribute {name!r}")
    return getattr(import_module(_PUBLIC[name]), name)
