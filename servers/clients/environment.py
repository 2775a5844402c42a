"""The model servers the environment names, and clients of them.

`MUR_BASE_URL` (and `MUR_MODEL`) name the backbone's server; `MUR_VERIFIER_URL` and
`MUR_VERIFIER_MODEL` the verifier's, which is the backbone unless one of them is set. What
`mur servers up` prints to export. `servers.connect` reads them between a command's flags and
the embedded server; `clients_from_env` is what a graph built without models uses (and all it
may use: graphs/ never start a server).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mur.servers.clients.chat_models import VLLMChatOpenAI, make_chat_model
from mur.servers.clients.errors import ServerError
from mur.servers.clients.probes import check_single_url

NO_SERVER = (
    "no model server: MUR_BASE_URL is unset. Start one (`mur servers up` prints what to export) "
    "and set MUR_BASE_URL (and MUR_MODEL) to it, or pass the chat models to build_graph"
)


@dataclass(frozen=True)
class EnvEndpoints:
    """The endpoints the environment names (None where a variable is unset or blank)."""

    base_url: str | None = None
    model: str | None = None
    verifier_url: str | None = None
    verifier_model: str | None = None

    @classmethod
    def read(cls, env: Mapping[str, str] | None = None) -> EnvEndpoints:
        """MUR_BASE_URL, MUR_MODEL, MUR_VERIFIER_URL and MUR_VERIFIER_MODEL of `env` (default:
        the process's)."""
        env = os.environ if env is None else env

        def read(name: str) -> str | None:
            return env.get(name, "").strip() or None

        return cls(
            read("MUR_BASE_URL"),
            read("MUR_MODEL"),
            read("MUR_VERIFIER_URL"),
            read("MUR_VERIFIER_MODEL"),
        )


def clients_from_env(
    env: Mapping[str, str] | None = None, **client_options: Any
) -> tuple[VLLMChatOpenAI, VLLMChatOpenAI]:
    """Backbone and verifier clients of the servers the environment names (the verifier is
    the backbone unless MUR_VERIFIER_URL or MUR_VERIFIER_MODEL is set). An unset MUR_MODEL
    asks the server what it serves. `client_options` go to `make_chat_model`. Raises
    ServerError naming MUR_BASE_URL when it is unset (or a URL variable holds a list: replicas
    go behind a router)."""
    endpoints = EnvEndpoints.read(env)
    if endpoints.base_url is None:
        raise ServerError(NO_SERVER)
    check_single_url(endpoints.base_url, "MUR_BASE_URL")
    check_single_url(endpoints.verifier_url, "MUR_VERIFIER_URL")
    backbone = make_chat_model(endpoints.base_url, endpoints.model, **client_options)
    if endpoints.verifier_url is None and endpoints.verifier_model is None:
        return backbone, backbone
    verifier = make_chat_model(
        endpoints.verifier_url or endpoints.base_url, endpoints.verifier_model, **client_options
    )
    return backbone, verifier
