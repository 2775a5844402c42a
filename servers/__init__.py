"""Serving layer: vLLM server profiles, process management, and the LangChain client factory.

Knows nothing of reasoning or benchmarks; everything hardware-specific (the CPU build, the
embedded PyPI model) stays here. Typical use:

    from mur.servers.connect import connect
    clients = connect(start=True)    # from flags, MUR_BASE_URL..., or the embedded server
    clients.backbone, clients.verifier               # LangChain chat models for the graph
    with session("run-1/question-7"):            # X-Session-ID: sticky behind vllm-router
        ...
"""

from mur.servers.clients import (
    SAMPLING_DEFAULTS,
    RequestTimeout,
    VLLMChatOpenAI,
    make_chat_model,
    resolve_model,
)
from mur.servers.connect import Connection
from mur.servers.errors import ModelError, ServerError, ServerUnavailable
from mur.servers.launcher import RunningServer, down, status, up
from mur.servers.metrics import generation_tokens, prompt_tokens, read_counter
from mur.servers.model import ensure_tiny_model, tiny_model_dir, verify_model_dir
from mur.servers.paths import mur_home
from mur.servers.probes import check_endpoint, check_single_url, normalize_base_url, root_url
from mur.servers.profiles import (
    DEFAULT_PROFILE,
    EMBEDDED_MODEL,
    Profile,
    command_line,
    get_profile,
    profiles,
)
from mur.servers.sessions import SESSION_HEADER, new_session_id, session

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
    "ServerUnavailable",
    "VLLMChatOpenAI",
    "check_endpoint",
    "check_single_url",
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
