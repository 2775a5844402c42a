"""MUR behind an OpenAI-compatible HTTP API, so any OpenAI client can call the reasoning loop.

    python -m servers.mur_endpoint [--host 127.0.0.1] [--port 8100]
        [--base-url URL --model NAME] [--verifier-url URL --verifier-model NAME]

Routes:
- `GET /v1/models`: one model per strategy x gate, `mur-<strategy>` for the gamma-gate and
  `mur-<strategy>-<gate>` for the baselines (`mur-critic`, `mur-best_of_n-always`, ...).
- `GET /health`: this endpoint is up (and which backbone/verifier it talks to).
- `POST /v1/chat/completions`: the model name picks strategy and gate; the LAST user message is
  the question, the last system (or developer) message the system prompt. Graph settings come
  in an extra body field `"mur": {...}` (any `graphs.state.Context` field but `gate`) and the
  top-level `seed`. OpenAI sampling fields (`temperature`, `max_tokens`, ...) are accepted and
  ignored: sampling is the backbone client's (the paper's), the step cap is `mur.max_step_tokens`.
  The reply's content is the kept steps as `StepN: text` lines (each ending in a newline), then
  the fallback text if any; the step trace (the graph's output contract minus the question) is
  the extra top-level field `mur`. With `"stream": true` each kept step is one SSE chunk as soon
  as it is kept (extra field `mur_step`: the step's event), then a final chunk with
  finish_reason "stop" and `mur`, then `data: [DONE]`; the streamed contents concatenate to the
  non-streamed content.

Errors use OpenAI's shape `{"error": {"message", "type", "param", "code"}}`: a bad request is
400, an unknown model 404, a failing graph (e.g. an unreachable backbone, named by URL) 502.

Why this lives in servers/: it is a serving concern; graphs/ and nodes/ stay unaware of HTTP.
The app is built by `create_app(backbone, verifier)` so tests inject fake chat models.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import typing
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from graphs.mur import build_graph
from graphs.state import STRATEGIES, Context, output_of
from nodes.draft import check_question
from nodes.gates import GATES
from servers.sessions import new_session_id, session

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8100
MODEL_PREFIX = "mur"
OWNER = "mur"


def model_name(strategy: str, gate: str) -> str:
    """`mur-<strategy>` for the gamma-gate (the method itself), `mur-<strategy>-<gate>` else."""
    return f"{MODEL_PREFIX}-{strategy}" if gate == "mur" else f"{MODEL_PREFIX}-{strategy}-{gate}"


MODELS: dict[str, tuple[str, str]] = {
    model_name(strategy, gate): (strategy, gate) for strategy in STRATEGIES for gate in GATES
}
"""Served model name -> (strategy, gate)."""


# ------------------------------------------------------------------------------- errors


class APIError(Exception):
    """An error answered to the client in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message = status, message
        self.type, self.code, self.param = type_, code, param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def _bad(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, code=code, param=param)


def _json_default(value: Any) -> Any:
    """Records may hold dataclasses or sets; anything else JSON lacks becomes its text."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in fields(value)}
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


def _dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, default=_json_default)


def _json(data: Any, status: int = 200) -> Response:
    return Response(_dumps(data), status_code=status, media_type="application/json")


def _error(exc: APIError) -> Response:
    return _json(exc.body(), exc.status)


def describe_failure(exc: BaseException, roles: Mapping[str, str] | None = None) -> str:
    """A message for a failed run; an unreachable or failing model server is named by URL.

    `roles` maps base URLs to "backbone"/"verifier" so the message says which one failed.
    """
    import openai

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, openai.APIError):
            request = getattr(current, "request", None)
            url = str(request.url) if request is not None else "?"
            who = next(
                (
                    f"the {role} at {base}"
                    for base, role in (roles or {}).items()
                    if base and url.startswith(base)
                ),
                f"the model server at {url}",
            )
            if isinstance(current, openai.APIConnectionError):
                return f"{who} is unreachable ({url}): {current}"
            status = getattr(current, "status_code", None)
            return f"{who} answered {f'HTTP {status}' if status else 'an error'}: {current}"
        current = current.__cause__ or current.__context__
    return f"{type(exc).__name__}: {exc}"


# ----------------------------------------------------------------------------- requests

_TYPES = typing.get_type_hints(Context)


def _check_setting(name: str, value: Any, param: str | None = None) -> Any:
    """Type-check one Context field strictly: JSON `true` is no integer, `"0.8"` no number."""
    kind = _TYPES[name]
    param = param or f"mur.{name}"
    if typing.get_origin(kind) is Literal:
        choices = typing.get_args(kind)
        if value not in choices:
            raise _bad(f"{param} must be one of {', '.join(map(repr, choices))}", param)
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise _bad(f"{param} must be true or false, got {value!r}", param)
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(f"{param} must be an integer, got {value!r}", param)
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(f"{param} must be a number, got {value!r}", param)
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            raise _bad(f"{param} must be a string, got {value!r}", param)
        return value
    return value


def make_context(
    gate: str, body: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> Context:
    """Context of one request: `defaults`, then top-level `seed`, then the `mur` field."""
    settings: dict[str, Any] = dict(defaults or {})
    if body.get("seed") is not None:
        settings["seed"] = _check_setting("seed", body["seed"], "seed")
    extra = body.get("mur")
    if extra is not None:
        if not isinstance(extra, Mapping):
            raise _bad("mur must be an object of graph settings", "mur")
        names = set(Context.field_names())
        for key, value in extra.items():
            if key == "gate":
                if value != gate:
                    raise _bad(
                        f"mur.gate {value!r} contradicts the model's gate {gate!r}: pick the "
                        f"gate with the model name ({model_name('critic', 'always')}, ...)",
                        "mur.gate",
                    )
                continue
            if key not in names:
                known = ", ".join(sorted(names - {"gate"}))
                raise _bad(f"unknown setting mur.{key}: choose among {known}", f"mur.{key}")
            settings[key] = _check_setting(key, value)
    settings.pop("gate", None)
    try:
        return Context(gate=gate, **settings)
    except (ValueError, TypeError) as exc:
        raise _bad(f"invalid mur settings: {exc}", "mur") from None


def _text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a content list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                raise _bad("only text content is supported", "messages")
        return "".join(parts)
    raise _bad("message content must be a string or a list of text parts", "messages")


def question_of(messages: Any) -> tuple[str, str | None]:
    """(question, system prompt): the last user message and the last system message."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list", "messages")
    question: str | None = None
    system: str | None = None
    for message in messages:
        if not isinstance(message, Mapping) or "role" not in message:
            raise _bad("each message must be an object with a role", "messages")
        if message["role"] == "user":
            question = _text(message.get("content"))
        elif message["role"] in ("system", "developer"):
            system = _text(message.get("content"))
    if question is None:
        raise _bad("the messages hold no user message: the last one is the question", "messages")
    try:
        check_question(question)  # the graph's own check, answered as 400 instead of 502
    except ValueError as exc:
        raise _bad(f"{exc} (the last user message is the question)", "messages") from None
    return question, system or None


@dataclass(frozen=True)
class Job:
    """One validated request."""

    model: str
    strategy: str
    gate: str
    question: str
    system_prompt: str | None
    context: Context
    stream: bool
    include_usage: bool


def parse_request(body: Any, defaults: Mapping[str, Any] | None = None) -> Job:
    """Validate a chat-completions body; APIError (400/404) says what is wrong."""
    if not isinstance(body, Mapping):
        raise _bad("the body must be a JSON object", code="invalid_request")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model is required", "model", code="missing_required_parameter")
    if model not in MODELS:
        raise APIError(
            404,
            f"The model {model!r} does not exist: GET /v1/models lists the "
            f"{len(MODELS)} served ones (e.g. mur-critic, mur-best_of_n-always).",
            code="model_not_found",
            param="model",
        )
    strategy, gate = MODELS[model]
    question, system = question_of(body.get("messages"))
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise _bad("stream must be true or false", "stream")
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad("n must be 1: one request runs one solution", "n")
    options = body.get("stream_options") or {}
    if not isinstance(options, Mapping):
        raise _bad("stream_options must be an object", "stream_options")
    context = make_context(gate, body, defaults)
    return Job(
        model=model,
        strategy=strategy,
        gate=gate,
        question=question,
        system_prompt=system,
        context=context,
        stream=stream,
        include_usage=bool(options.get("include_usage")),
    )


# ---------------------------------------------------------------------------- responses


def step_line(step: Mapping[str, Any]) -> str:
    return f"Step{step['index']}: {step['text']}\n"


def trace_of(result: Mapping[str, Any]) -> dict[str, Any]:
    """The graph's output contract minus the question (the client sent it)."""
    return {key: value for key, value in output_of(dict(result)).items() if key != "question"}


def content_of(trace: Mapping[str, Any]) -> str:
    """The kept steps, one `StepN: text` line each, then the fallback text if any."""
    fallback = trace.get("fallback")
    return "".join(step_line(s) for s in trace.get("steps") or []) + (
        fallback["text"] if fallback else ""
    )


def usage_of(trace: Mapping[str, Any]) -> dict[str, int]:
    """OpenAI usage: completion = backbone + external generated tokens of the whole run."""
    usage = trace.get("usage") or {}
    prompt = int(usage.get("backbone_prompt_tokens", 0)) + int(
        usage.get("external_prompt_tokens", 0)
    )
    completion = int(usage.get("backbone_tokens", 0)) + int(usage.get("external_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion_body(job: Job, trace: dict[str, Any], cid: str, created: int) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": job.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content_of(trace)},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": usage_of(trace),
        "mur": trace,
    }


def _chunk(job: Job, cid: str, created: int, **fields_: Any) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": job.model,
        **fields_,
    }


def _sse(data: Any) -> bytes:
    return f"data: {data if isinstance(data, str) else _dumps(data)}\n\n".encode()


# ---------------------------------------------------------------------------------- app

Event = tuple[Literal["step", "done", "error"], Any]


class MurService:
    """Compiled graphs (one per strategy, built on first use) and the runs over them."""

    def __init__(
        self,
        backbone: BaseChatModel,
        verifier: BaseChatModel | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        self.backbone = backbone
        self.verifier = verifier or backbone
        self.defaults = dict(defaults or {})
        self._graphs: dict[str, Any] = {}
        # Base URL -> role, for error messages; a shared URL is named as the backbone.
        self.roles = {
            url: role
            for role, url in (
                ("verifier", _base_url(self.verifier)),
                ("backbone", _base_url(self.backbone)),
            )
            if url
        }

    def graph(self, strategy: str) -> Any:
        """The compiled graph of `strategy`; built once (no await in here, so no race)."""
        if strategy not in self._graphs:
            self._graphs[strategy] = build_graph(
                strategy, backbone=self.backbone, verifier=self.verifier
            )
        return self._graphs[strategy]

    def start(self, job: Job) -> tuple[asyncio.Task[None], asyncio.Queue[Event]]:
        """Run the graph in its own task, feeding kept steps and the end into a queue.

        A task (not an async generator resumed from the response's task) keeps LangGraph's
        context variables in one task and lets a disconnect cancel the run.
        """
        queue: asyncio.Queue[Event] = asyncio.Queue()
        graph = self.graph(job.strategy)

        async def run() -> None:
            final: dict[str, Any] = {}
            try:
                # One session per completion: a router keeps this question on one replica.
                with session(new_session_id("mur-endpoint", uuid.uuid4().hex[:12])):
                    async for mode, chunk in graph.astream(
                        {"question": job.question, "system_prompt": job.system_prompt},
                        context=job.context,
                        stream_mode=["custom", "values"],
                    ):
                        if mode == "custom" and chunk.get("event") == "step":
                            queue.put_nowait(("step", chunk))
                        elif mode == "values":
                            final = chunk
                queue.put_nowait(("done", trace_of(final)))
            except Exception as exc:
                queue.put_nowait(("error", exc))

        return asyncio.create_task(run(), name=f"mur-{job.model}"), queue

    def failure(self, exc: BaseException) -> APIError:
        return APIError(
            502, describe_failure(exc, self.roles), type_="server_error", code="upstream_error"
        )


def _base_url(model: Any) -> str | None:
    url = getattr(model, "openai_api_base", None)
    return str(url).rstrip("/") if url else None


def _model_info(model: Any) -> dict[str, Any]:
    return {
        "base_url": _base_url(model),
        "model": getattr(model, "model_name", None) or type(model).__name__,
    }


def create_app(
    backbone: BaseChatModel,
    verifier: BaseChatModel | None = None,
    *,
    defaults: Mapping[str, Any] | None = None,
) -> Starlette:
    """The ASGI app over injected chat models (the verifier defaults to the backbone).

    `defaults` are Context settings every request starts from (e.g. a profile's
    `recommended`); a request's `mur` field overrides them.
    """
    if defaults:
        try:
            make_context("mur", {"mur": {k: v for k, v in defaults.items() if k != "gate"}})
        except APIError as exc:
            raise ValueError(f"bad default settings: {exc.message}") from None
    service = MurService(backbone, verifier, defaults)
    started = int(time.time())

    async def models(request: Request) -> Response:
        data = [
            {
                "id": name,
                "object": "model",
                "created": started,
                "owned_by": OWNER,
                "strategy": strategy,
                "gate": gate,
            }
            for name, (strategy, gate) in MODELS.items()
        ]
        return _json({"object": "list", "data": data})

    async def health(request: Request) -> Response:
        return _json(
            {
                "status": "ok",
                "backbone": _model_info(service.backbone),
                "verifier": _model_info(service.verifier),
            }
        )

    async def chat_completions(request: Request) -> Response:
        try:
            body = json.loads(await request.body() or b"null")
        except ValueError as exc:
            return _error(_bad(f"the body is not valid JSON: {exc}", code="invalid_json"))
        try:
            job = parse_request(body, service.defaults)
        except APIError as exc:
            return _error(exc)
        cid = f"chatcmpl-mur-{uuid.uuid4().hex}"
        created = int(time.time())
        task, queue = service.start(job)
        if job.stream:
            return await _stream(job, task, queue, service, cid, created)
        try:
            while True:
                kind, payload = await queue.get()
                if kind == "error":
                    return _error(service.failure(payload))
                if kind == "done":
                    return _json(completion_body(job, payload, cid, created))
        finally:
            task.cancel()

    return Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        ]
    )


async def _stream(
    job: Job,
    task: asyncio.Task[None],
    queue: asyncio.Queue[Event],
    service: MurService,
    cid: str,
    created: int,
) -> Response:
    """SSE response; waits for the first event so a run that fails at once is a plain 502."""
    first = await queue.get()
    if first[0] == "error":
        task.cancel()
        return _error(service.failure(first[1]))

    async def events() -> AsyncIterator[bytes]:
        role: dict[str, str] = {"role": "assistant"}  # the first delta carries the role
        event: Event | None = first
        try:
            while True:
                if event is None:
                    event = await queue.get()
                kind, payload = event
                event = None
                if kind == "step":
                    delta = {**role, "content": step_line(payload)}
                    role = {}
                    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
                    yield _sse(_chunk(job, cid, created, choices=[choice], mur_step=payload))
                elif kind == "done":
                    fallback = payload.get("fallback")
                    delta = {**role, "content": fallback["text"] if fallback else ""}
                    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": "stop"}
                    extra = {"usage": None} if job.include_usage else {}
                    yield _sse(_chunk(job, cid, created, choices=[choice], mur=payload, **extra))
                    if job.include_usage:
                        yield _sse(_chunk(job, cid, created, choices=[], usage=usage_of(payload)))
                    yield _sse("[DONE]")
                    return
                else:
                    # Headers are sent: report the failure in-stream, as OpenAI does.
                    yield _sse(service.failure(payload).body())
                    return
        finally:
            task.cancel()

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@contextlib.contextmanager
def running(
    app: Any, host: str = DEFAULT_HOST, port: int = 0, timeout: float = 10
) -> Iterator[str]:
    """Serve `app` with uvicorn in a background thread; yields its base URL (`.../v1`).

    Port 0 takes a free port (the socket is bound here, so there is no race for it). For
    tests and notebooks; `main` runs uvicorn in the foreground instead.
    """
    import socket
    import threading

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="mur-endpoint", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"the MUR endpoint did not start on {host}:{bound_port}")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{bound_port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()


# ---------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m servers.mur_endpoint",
        description="Serve MUR (every strategy x gate) as an OpenAI-compatible chat API.",
    )
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--base-url", help="backbone server (default: MUR_BASE_URL or cpu-tiny)")
    parser.add_argument("--model", help="backbone model name (default: ask the server)")
    parser.add_argument("--verifier-url", help="verifier server (default: the backbone's)")
    parser.add_argument("--verifier-model", help="verifier model name (default: ask the server)")
    parser.add_argument(
        "--profile",
        help="take this server profile's recommended graph settings as defaults "
        "(default: cpu-tiny's when the backbone is the embedded cpu-tiny server)",
    )
    parser.add_argument("--log-level", default="info")
    return parser


def connect(args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any], str]:
    """(backbone, verifier, default settings, description) from flags, env or cpu-tiny."""
    from servers.clients import default_endpoints, make_chat_model, resolve_model
    from servers.launcher import normalize_base_url
    from servers.profiles import DEFAULT_PROFILE, get_profile

    if args.model and not args.base_url:
        raise ValueError("--model needs --base-url")
    default_backbone, default_verifier = default_endpoints()
    base_url = normalize_base_url(args.base_url) if args.base_url else default_backbone.base_url
    model = (args.model if args.base_url else default_backbone.model) or resolve_model(base_url)
    if args.verifier_url or args.verifier_model:
        verifier_url = normalize_base_url(args.verifier_url) if args.verifier_url else base_url
        verifier_model = args.verifier_model or resolve_model(verifier_url)
    elif args.base_url or default_verifier == default_backbone:
        verifier_url, verifier_model = base_url, model
    else:
        verifier_url = default_verifier.base_url
        verifier_model = default_verifier.model or resolve_model(verifier_url)
    backbone = make_chat_model(base_url, model)
    same = (verifier_url, verifier_model) == (base_url, model)
    verifier = backbone if same else make_chat_model(verifier_url, verifier_model)
    profile = args.profile
    tiny = get_profile(DEFAULT_PROFILE)
    if profile is None and backbone.openai_api_base == tiny.base_url:
        profile = DEFAULT_PROFILE
    defaults = dict(get_profile(profile).recommended) if profile else {}
    note = f"backbone {model} at {backbone.openai_api_base}"
    if not same:
        note += f"; verifier {verifier_model} at {verifier.openai_api_base}"
    if profile:
        note += f"; defaults of profile {profile}: {defaults}"
    return backbone, verifier, defaults, note


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from servers.errors import ServerError

    args = _parser().parse_args(argv)
    try:
        backbone, verifier, defaults, note = connect(args)
    except (ServerError, KeyError, ValueError) as exc:
        print(f"python -m servers.mur_endpoint: {exc}", file=sys.stderr)
        return 1
    app = create_app(backbone, verifier, defaults=defaults)
    print(
        f"MUR endpoint on http://{args.host}:{args.port}/v1 ({len(MODELS)} models); {note}",
        file=sys.stderr,
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
