"""`stream=true`: one server-sent event per kept step, as soon as it is kept (sse-starlette).

Each step is a chunk whose delta is the step's `StepN: text` line, with the step's event as
`mur_step`; then a final chunk with finish_reason "stop" and the trace as `mur`. With several
traces (`mur.traces`) the steps of every trace stream as they are kept, each `mur_step` naming
its trace, with empty deltas: only the vote says whose steps are the answer, so the final chunk
carries the content of the trace that stands for it. Then, with
`stream_options.include_usage`, a choice-less usage chunk; then `data: [DONE]`. A run that
fails after the headers were sent reports the error in the stream, as OpenAI does. Comment
pings keep idle connections open through proxies while a long step is generated.

When the client disconnects, sse-starlette cancels the event generator, whose `finally`
cancels the run.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi.encoders import jsonable_encoder
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from sse_starlette import EventSourceResponse, ServerSentEvent

from mur.endpoint.replies import chunk, content_of, dump, step_line, usage_of
from mur.endpoint.runs import END, Run, RunService

PING_SECONDS = 15


def _event(data: str) -> ServerSentEvent:
    return ServerSentEvent(data=data, sep="\n")


def _delta(content: str, first: bool) -> ChoiceDelta:
    """A content delta; the first of a stream also carries the role."""
    return ChoiceDelta(role="assistant", content=content) if first else ChoiceDelta(content=content)


async def events(
    run: Run, service: RunService, first: Mapping[str, Any] | None, cid: str, created: int
) -> AsyncIterator[ServerSentEvent]:
    """The stream of `run`, starting with its first step (`first`, already taken; END when the
    run kept no step)."""
    job = run.job
    several = job.context.traces > 1
    step, sent = first, 0
    try:
        while step is not END:
            line = "" if several else step_line(step, job.context.step_format)
            delta = _delta(line, first=sent == 0)
            yield _event(dump(chunk(job, cid, created, delta, mur_step=jsonable_encoder(step))))
            sent += 1
            step = await run.steps.get()
        try:
            trace = await run.task
        except Exception as exc:
            yield _event(json.dumps(service.failure(exc).body()))
            return
        fallback = trace.get("fallback")
        # One trace streamed its steps already; several send the voted trace's content now.
        rest = content_of(trace) if several else (fallback["text"] if fallback else "")
        delta = _delta(rest, first=sent == 0)
        extra: dict[str, Any] = {"usage": None} if job.include_usage else {}
        yield _event(dump(chunk(job, cid, created, delta, finish=True, mur=trace, **extra)))
        if job.include_usage:
            yield _event(dump(chunk(job, cid, created, None, usage=usage_of(trace))))
        yield _event("[DONE]")
    finally:
        run.task.cancel()


def stream_response(
    run: Run, service: RunService, first: Mapping[str, Any] | None, cid: str, created: int
) -> EventSourceResponse:
    return EventSourceResponse(
        events(run, service, first, cid, created),
        ping=PING_SECONDS,
        sep="\n",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
