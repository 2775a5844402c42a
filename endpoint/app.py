"""The FastAPI app and its routes:

- `GET /v1/models`: one model per strategy x gate (`mur-critic`, `mur-best_of_n-always`, ...).
- `GET /health`: this endpoint is up; which backbone/verifier it talks to and how many runs
  are in flight (details only for a client with the key when a key is set).
- `POST /v1/chat/completions`: the model name picks strategy and gate; the LAST user message is
  the question, the last system (or developer) message the system prompt; graph settings in
  the extra body field `mur` and the top-level `seed`.

A request with an `Idempotency-Key` header (or `mur.idempotency_key`) names its run, which is
checkpointed after each node in the checkpointer the app opens in its lifespan (`checkpointer`:
an SQLite file, in memory by default here, or a PostgreSQL URL; see persistence/checkpointers.py):
the same key again gets the finished run's reply without recomputing it, or resumes the run
where it stopped (endpoint/durable.py). A request without a key is a run nothing can resume:
it writes no checkpoint and no ledger row.

Errors are OpenAI's shape: 400 bad request, 401 missing/wrong key, 404 unknown model, 409 the
key's run still running (with Retry-After), 413 body too large, 422 a key reused for another
request, 429 every run slot taken (with Retry-After), 502 a failing graph run (e.g. an
unreachable backbone, named by URL), 503 the checkpointer database not answering (a keyed
request). A client that disconnects cancels its run (its checkpoints stay for a retry with its
key).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from langchain_core.language_models import BaseChatModel
from openai.types.chat import ChatCompletion
from starlette.datastructures import Headers

from mur.endpoint.durable import StoredReply
from mur.endpoint.errors import APIError, install_handlers
from mur.endpoint.guards import ApiKey, LimitBody, RequireApiKey
from mur.endpoint.idempotency import caller_of, fingerprint, split_key
from mur.endpoint.refusals import RUN_DRAINED
from mur.endpoint.replies import RunResult, completion, dump, model_list
from mur.endpoint.runs import (
    DEFAULT_KEEP_FINISHED,
    DEFAULT_LEASE_SECONDS,
    END,
    ClientGone,
    RunService,
    describe_model,
    run_was_drained,
    unless_disconnected,
)
from mur.endpoint.schemas import ChatCompletionRequest, make_context, parse_job
from mur.endpoint.streaming import events, replayed, stream_response
from mur.persistence.checkpointers import MEMORY, open_checkpointer
from mur.persistence.ledger import SCHEMA

DEFAULT_MAX_RUNS = 64
DEFAULT_MAX_REQUEST_BYTES = 1 << 20
CLIENT_CLOSED = 499
"""Status logged for a request whose client went away (nginx's convention); never received."""


def check_defaults(defaults: Mapping[str, Any] | None) -> None:
    """Default settings that no request could run with stop the app at start, naming them."""
    if defaults:
        try:
            make_context("mur", {k: v for k, v in defaults.items() if k != "gate"})
        except APIError as exc:
            raise ValueError(f"bad default settings: {exc.message}") from None


def lifespan_of(
    service: RunService, checkpointer: str
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the checkpointer open (and the service over it) while it serves."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_checkpointer(checkpointer, schema=SCHEMA) as store:
            await service.open(store)
            try:
                yield
            finally:
                await service.close()

    return lifespan


async def answer(
    service: RunService,
    body: ChatCompletionRequest,
    request: Request,
    defaults: Mapping[str, Any] | None,
) -> Response:
    """POST /v1/chat/completions: claim the request's run, then replay its recorded reply, or
    run (resume) it and answer, streamed or whole."""
    body, idempotency_key = split_key(body, request.headers)
    job = parse_job(body, defaults)
    admitted = await service.admit(job, caller_of(request.scope), idempotency_key, fingerprint(job))
    if isinstance(admitted, StoredReply):  # a retry of a finished run: nothing recomputed
        if job.stream:
            return stream_response(replayed(job, admitted, idempotency_key))
        result = RunResult(admitted.trace, {}, "replayed")
        reply = completion(job, result, admitted.cid, admitted.created, idempotency_key)
        return Response(dump(reply), media_type="application/json")
    run = service.start(job, admitted)
    try:
        if job.stream:
            # Wait for the first step, so that a run failing at once is a plain 502.
            first = await unless_disconnected(run.steps.get(), request.receive, run)
            if first is END:
                await run.task  # done by now; raises if the run failed
            return stream_response(events(run, service, first))
        result = await unless_disconnected(run.task, request.receive, run)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED)
    except asyncio.CancelledError:
        if not run_was_drained(run, service):
            raise  # this request itself is cancelled (the server stops at once)
        raise RUN_DRAINED from None
    except Exception as exc:  # the run's own failure
        raise service.failure(exc) from exc
    reply = completion(job, result, admitted.cid, admitted.created, idempotency_key)
    return Response(dump(reply), media_type="application/json")


def health_reply(service: RunService, key: ApiKey | None, request: Request) -> Response:
    """GET /health: 200, or 503 while draining so a load balancer's health check takes this
    replica out; which servers it talks to and its runs only for a caller with the key."""
    status = "ok" if service.accepting else "draining"
    code, headers = (200, None) if service.accepting else (503, {"Retry-After": "1"})
    if key is not None and not key.admits(Headers(scope=request.scope)):
        return JSONResponse({"status": status}, code, headers)
    details = {
        "status": status,
        "backbone": describe_model(service.backbone),
        "verifier": describe_model(service.verifier),
        "runs_in_flight": service.in_flight,
        "max_runs": service.max_runs,
    }
    return JSONResponse(details, code, headers)


def create_app(
    backbone: BaseChatModel,
    verifier: BaseChatModel | None = None,
    *,
    defaults: Mapping[str, Any] | None = None,
    api_key: str | Sequence[str] | None = None,
    max_runs: int = DEFAULT_MAX_RUNS,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    retry_after: int = 1,
    checkpointer: str = MEMORY,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    keep_finished: float = DEFAULT_KEEP_FINISHED,
    replica_id: str | None = None,
) -> FastAPI:
    """The ASGI app over injected chat models (the verifier defaults to the backbone).

    `defaults` are Context settings every request starts from (e.g. a profile's
    `recommended`); a request's `mur` field overrides them. `api_key` (None: open; several:
    each caller its own, idempotency keys scoped to it) is required as a bearer token;
    `max_runs` graph runs at once, beyond which requests get 429; `max_request_bytes` bounds a
    body (413). `checkpointer` is where runs are checkpointed (persistence.checkpointers; opened in
    the app's lifespan); a run's claim is a lease of `lease_seconds`, renewed while it runs;
    finished runs are kept `keep_finished` seconds for retries. `replica_id` names this
    process in the run ledger (default host-pid).
    """
    check_defaults(defaults)
    service = RunService(
        backbone,
        verifier,
        max_runs=max_runs,
        retry_after=retry_after,
        replica_id=replica_id,
        lease_seconds=lease_seconds,
        keep_finished=keep_finished,
    )
    key = ApiKey(api_key) if api_key is not None else None
    started = int(time.time())

    app = FastAPI(
        title="MUR",
        summary="Momentum Uncertainty guided Reasoning behind an OpenAI-compatible API",
        version="0.1.0",
        lifespan=lifespan_of(service, checkpointer),
    )
    app.state.service = service
    install_handlers(app)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return model_list(started)

    @app.get("/health")
    async def health(request: Request) -> Response:
        return health_reply(service, key, request)

    @app.post(
        "/v1/chat/completions",
        response_model=None,
        responses={
            200: {"model": ChatCompletion, "description": "the solution, or its SSE stream"}
        },
    )
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await answer(service, body, request, defaults)

    # Added last = outermost: the key is checked before the body is read.
    app.add_middleware(LimitBody, limit=max_request_bytes)
    if key is not None:
        app.add_middleware(RequireApiKey, key=key)
    return app
