"""Every answer that refuses or defers a run, in one place: 409 (the key's run is running, or
was taken over), 422 (a key reused for another request), 429 (every run slot taken), 503 (the
replica drains, or the checkpointer's database does not answer). Each says what to do, and
those worth retrying carry Retry-After.
"""

from __future__ import annotations

import math

from mur.endpoint.errors import APIError
from mur.endpoint.idempotency import HEADER
from mur.persistence.checkpointers import CheckpointerError, CheckpointTarget, scrub


def busy(key: str, retry_after: float) -> APIError:
    seconds = max(1, math.ceil(retry_after))
    return APIError(
        409,
        f"the run of idempotency key {key!r} is still running (on this or another replica): "
        f"retry after {seconds} s with the same key, to get its reply or resume it where it "
        "stopped",
        code="run_in_progress",
        headers={"Retry-After": str(seconds)},
    )


def expired(key: str) -> APIError:
    """409: the key's run ended more than --keep-finished ago and is being deleted; once it is
    gone (a moment), the key starts a new run."""
    return APIError(
        409,
        f"the run of idempotency key {key!r} ended long ago and is being deleted (it was kept "
        "--keep-finished seconds): retry in a second with the same key to run it afresh",
        code="run_expired",
        headers={"Retry-After": "1"},
    )


def key_reused(key: str) -> APIError:
    return APIError(
        422,
        f"the idempotency key {key!r} was first sent with a different request (model, "
        "messages or settings): use a new key for a new request",
        code="idempotency_key_reused",
        param=HEADER,
    )


def lease_lost(key: str | None) -> APIError:
    """409: the run's claim was taken over. A keyless run has no claim to lose, but should
    one ever be stopped this way its client is told what it can do: no key to retry with, so
    send one to make the next run resumable."""
    if key is None:
        message = (
            f"this run (sent without an {HEADER}) was stopped on this replica and cannot be "
            f"resumed: retry with an {HEADER} header to make a run resumable (a retry without "
            "one starts afresh)"
        )
    else:
        message = (
            f"the run of idempotency key {key!r} was taken over by another replica while this "
            "one stalled: retry with the same key to get its reply"
        )
    return APIError(409, message, code="run_taken_over", headers={"Retry-After": "1"})


def unavailable(exc: BaseException, target: CheckpointTarget | None = None) -> APIError:
    """503: the checkpointer's database does not answer. A CheckpointerError names the
    database itself; a driver's error is named by `target` (its password as `***`)."""
    message = str(exc)
    if target is not None and not isinstance(exc, CheckpointerError):
        detail = scrub(message, target.location)
        message = f"the checkpointer database {target} stopped answering: {detail}"
    return APIError(
        503,
        f"{message}; retry in a few seconds",
        type_="server_error",
        code="checkpointer_unavailable",
        headers={"Retry-After": "5"},
    )


class Saturated(APIError):
    """429: every run slot is taken; the client should retry after `retry_after` seconds."""

    def __init__(self, limit: int, retry_after: int) -> None:
        super().__init__(
            429,
            f"the MUR endpoint is running its limit of {limit} solutions: retry after "
            f"{retry_after} s",
            type_="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(retry_after)},
        )


DRAINING = APIError(
    503,
    "this MUR endpoint replica is shutting down and takes no new runs: retry (another replica "
    "takes it; a run with an Idempotency-Key resumes where it stopped)",
    type_="server_error",
    code="draining",
    headers={"Retry-After": "1"},
)
RUN_DRAINED = APIError(
    503,
    "this MUR endpoint replica shut down during the run: retry with the same Idempotency-Key "
    "and another replica resumes it after its last finished step (a request without a key "
    "starts afresh)",
    type_="server_error",
    code="draining",
    headers={"Retry-After": "1"},
)
NOT_OPEN = APIError(
    503,
    "the endpoint's checkpointer is not open: serve the app with its lifespan (uvicorn's "
    "default), which opens it",
    type_="server_error",
    code="checkpointer_unavailable",
)
