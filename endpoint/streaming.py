"""`stream=true`: one server-sent event per kept step, as soon as it is kept (sse-starlette).

Each step is a chunk whose delta is the step's `StepN: text` line, with the step's event as
`mur_step`; then a final chunk with finish_reason "stop" and the trace as `mur`. With several
traces (`mur.traces`) the steps of every trace stream as they are kept, each `mur_step` naming
its trace, with empty deltas: only the vote says whose steps are the answer, so the final chunk
carries the content of the trace that stands for it. Then, with
`stream_options.include_usage`, a choice-less usage chunk (this request's usage); then
`data: [DONE]`. A run that fails after the headers were sent reports the error in the stream,
as OpenAI does (a run cut by the replica's drain: the 503 that says to retry with the
key). Comment pings keep idle connections open through proxies while a long step is generated.

A resumed run first streams the steps it had kept before (`mur_step.restored`), and a retry
of a finished run streams its recorded reply the same way, so the contents always concatenate
to the whole solution.

When the client disconnects, sse-starlette cancels the event generator, whose `finally`
cancels the run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from fastapi.encoders import jsonable_encoder
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from sse_starlette import EventSourceResponse, ServerSentEvent

from mur.endpoint.durable import StoredReply
from mur.endpoint.refusals import RUN_DRAINED
from mur.endpoint.replies import RunResult, chunk, dump, reply_trace
from mur.endpoint.runs import END, Run, RunService, run_was_drained
from mur.endpoint.schemas import Job
from mur.integrations.chat import closing_text, streamed_line, usage_of

PING_SECONDS = 15


def _event(data: str) -> ServerSentEvent:
    return ServerSentEvent(data=data, sep="\n")


def _delta(content: str, first: bool) -> ChoiceDelta:
    """A content delta; the first of a stream also carries the role."""
    return ChoiceDelta(role="assistant", content=content) if first else ChoiceDelta(content=content)


def _ending(
    job: Job, result: RunResult, cid: str, created: int, key: str | None, sent: int
) -> Iterator[ServerSentEvent]:
    """The final chunk (the content not streamed yet, the trace as `mur`), the usage chunk on
    request (this request's usage), then `[DONE]`."""
    trace = result.trace
    delta = _delta(closing_text(trace, job.context), first=sent == 0)
    extra: dict[str, Any] = {"usage": None} if job.include_usage else {}
    mur = reply_trace(trace, result.outcome, key)
    yield _event(dump(chunk(job, cid, created, delta, finish=True, mur=mur, **extra)))
    if job.include_usage:
        usage = usage_of(result.request_usage)
        yield _event(dump(chunk(job, cid, created, None, usage=usage)))
    yield _event("[DONE]")


def _step_event(
    job: Job, cid: str, created: int, step: Mapping[str, Any], sent: int
) -> ServerSentEvent:
    delta = _delta(streamed_line(step, job.context), first=sent == 0)
    return _event(dump(chunk(job, cid, created, delta, mur_step=jsonable_encoder(step))))


async def events(
    run: Run, service: RunService, first: Mapping[str, Any] | None
) -> AsyncIterator[ServerSentEvent]:
    """The stream of `run`, starting with its first step (`first`, already taken; END when the
    run kept no step). A resumed run first sends the steps it had kept (`restored`)."""
    job, ticket = run.job, run.ticket
    step, sent = first, 0
    try:
        while step is not END:
            yield _step_event(job, ticket.cid, ticket.created, step, sent)
            sent += 1
            step = await run.steps.get()
        try:
            result = await run.task
        except asyncio.CancelledError:
            if not run_was_drained(run, service):
                raise
            yield _event(json.dumps(RUN_DRAINED.body()))  # retry with the key to resume
            return
        except Exception as exc:
            yield _event(json.dumps(service.failure(exc).body()))
            return
        for event in _ending(job, result, ticket.cid, ticket.created, ticket.key, sent):
            yield event
    finally:
        run.task.cancel()


async def replayed(
    job: Job, stored: StoredReply, key: str | None
) -> AsyncIterator[ServerSentEvent]:
    """The stream of a finished run's recorded reply: its kept steps, then the ending."""
    result = RunResult(stored.trace, {}, "replayed")
    steps = (stored.trace.get("steps") or []) if job.context.traces == 1 else []
    for sent, step in enumerate(steps):
        restored = {"event": "step", "trace": 0, **step, "restored": True}
        yield _step_event(job, stored.cid, stored.created, restored, sent)
    for event in _ending(job, result, stored.cid, stored.created, key, len(steps)):
        yield event


def stream_response(stream: AsyncIterator[ServerSentEvent]) -> EventSourceResponse:
    return EventSourceResponse(
        stream,
        ping=PING_SECONDS,
        sep="\n",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
