"""The FastAPI app and its routes:

- `GET /v1/models`: one model per strategy x gate (`mur-critic`, `mur-best_of_n-always`, ...).
- `GET /health`: this endpoint is up; which backbone/verifier it talks to and how many runs
  are in flight (details only for a client with the key when a key is set).
- `POST /v1/chat/completions`: the model name picks strategy and gate; the LAST user message is
  the question, the last system (or developer) message the system prompt; graph settings in
  the extra body field `mur` and the top-level `seed`.

Errors are OpenAI's shape: 400 bad request, 401 missing/wrong key, 404 unknown model, 413 body
too large, 429 every run slot taken (with Retry-After), 502 a failing graph run (e.g. an
unreachable backbone, named by URL). A client that disconnects cancels its run.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request, Response
from langchain_core.language_models import BaseChatModel
from openai.types.chat import ChatCompletion
from starlette.datastructures import Headers

from mur.endpoint.errors import APIError, install_handlers
from mur.endpoint.guards import ApiKey, LimitBody, RequireApiKey
from mur.endpoint.replies import completion, dump, model_list
from mur.endpoint.runs import END, ClientGone, RunService, describe_model, unless_disconnected
from mur.endpoint.schemas import ChatCompletionRequest, make_context, parse_job
from mur.endpoint.streaming import stream_response

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


def create_app(
    backbone: BaseChatModel,
    verifier: BaseChatModel | None = None,
    *,
    defaults: Mapping[str, Any] | None = None,
    api_key: str | None = None,
    max_runs: int = DEFAULT_MAX_RUNS,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    retry_after: int = 1,
) -> FastAPI:
    """The ASGI app over injected chat models (the verifier defaults to the backbone).

    `defaults` are Context settings every request starts from (e.g. a profile's
    `recommended`); a request's `mur` field overrides them. `api_key` (None: open) is required
    as a bearer token; `max_runs` graph runs at once, beyond which requests get 429;
    `max_request_bytes` bounds a body (413).
    """
    check_defaults(defaults)
    service = RunService(backbone, verifier, max_runs=max_runs, retry_after=retry_after)
    key = ApiKey(api_key) if api_key is not None else None
    started = int(time.time())
    app = FastAPI(
        title="MUR",
        summary="Momentum Uncertainty guided Reasoning behind an OpenAI-compatible API",
        version="0.1.0",
    )
    app.state.service = service
    install_handlers(app)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return model_list(started)

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        if key is not None and not key.admits(Headers(scope=request.scope)):
            return {"status": "ok"}
        return {
            "status": "ok",
            "backbone": describe_model(service.backbone),
            "verifier": describe_model(service.verifier),
            "runs_in_flight": service.in_flight,
            "max_runs": service.max_runs,
        }

    @app.post(
        "/v1/chat/completions",
        response_model=None,
        responses={
            200: {"model": ChatCompletion, "description": "the solution, or its SSE stream"}
        },
    )
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        job = parse_job(body, defaults)
        cid = f"chatcmpl-mur-{uuid.uuid4().hex}"
        created = int(time.time())
        run = service.start(job)
        try:
            if job.stream:
                # Wait for the first step, so that a run failing at once is a plain 502.
                first = await unless_disconnected(run.steps.get(), request.receive, run)
                if first is END:
                    await run.task  # done by now; raises if the run failed
                return stream_response(run, service, first, cid, created)
            trace = await unless_disconnected(run.task, request.receive, run)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        except Exception as exc:  # the run's own failure
            raise service.failure(exc) from exc
        reply = completion(job, trace, cid, created)
        return Response(dump(reply), media_type="application/json")

    # Added last = outermost: the key is checked before the body is read.
    app.add_middleware(LimitBody, limit=max_request_bytes)
    if key is not None:
        app.add_middleware(RequireApiKey, key=key)
    return app
