"""A fault-injecting OpenAI-compatible server on loopback, to drive the real client code.

Each chat request takes the next behaviour from a script (the last one repeats):
  "ok"           a valid reply with token logprobs and usage (ends the solution)
  "500"          HTTP 500 with an OpenAI-style error body
  "400"          HTTP 400 (a permanent error)
  "delay:S"      sleep S seconds, then reply "ok"
  "no_logprobs"  a valid reply without logprobs
  "cut"          headers promise more body than is sent, then the connection closes
  "garbage"      HTTP 200 with a body that is not JSON
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "faulty-model"
REPLY_TEXT = " 2 + 2 = 4, so the answer is 4."


def chat_reply(with_logprobs: bool = True) -> dict[str, Any]:
    tokens = [" 2", " +", " 2", " =", " 4", ",", " so", " the", " answer", " is", " 4", "."]
    logprobs = {
        "content": [
            {"token": t, "logprob": -0.25, "bytes": list(t.encode()), "top_logprobs": []}
            for t in [*tokens, "<|im_end|>"]
        ]
    }
    return {
        "id": "chatcmpl-fault",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": REPLY_TEXT},
                "logprobs": logprobs if with_logprobs else None,
                "finish_reason": "stop",
                "stop_reason": None,
            }
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 13, "total_tokens": 33},
    }


class FaultyServer:
    """Serves on 127.0.0.1 (a free port) in a thread; `requests` counts chat requests,
    `sessions` holds each one's `X-Session-ID` header."""

    def __init__(self, script: Sequence[str]) -> None:
        self.script = list(script)
        self.requests = 0
        self.sessions: list[str | None] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                return

            def _send(self, status: int, body: bytes, length: int | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path.endswith("/models"):
                    body = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
                    self._send(200, json.dumps(body).encode())
                else:
                    self._send(200, b"{}")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.sessions.append(self.headers.get("X-Session-ID"))
                behaviour = server.next_behaviour()
                if behaviour.startswith("delay:"):
                    time.sleep(float(behaviour.split(":", 1)[1]))
                    behaviour = "ok"
                if behaviour == "ok":
                    self._send(200, json.dumps(chat_reply()).encode())
                elif behaviour == "no_logprobs":
                    self._send(200, json.dumps(chat_reply(with_logprobs=False)).encode())
                elif behaviour in ("500", "400"):
                    error = {"error": {"message": f"injected {behaviour}", "type": "fault"}}
                    self._send(int(behaviour), json.dumps(error).encode())
                elif behaviour == "cut":
                    body = json.dumps(chat_reply()).encode()
                    self._send(200, body[: len(body) // 2], length=len(body))
                    self.close_connection = True
                elif behaviour == "garbage":
                    self._send(200, b"<html>this is not json</html>")
                else:
                    raise ValueError(f"unknown behaviour {behaviour!r}")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def next_behaviour(self) -> str:
        with self._lock:
            self.requests += 1
            index = min(self.requests - 1, len(self.script) - 1)
            return self.script[index]


@contextmanager
def faulty_server(script: Sequence[str]) -> Iterator[FaultyServer]:
    server = FaultyServer(script)
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
