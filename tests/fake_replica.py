"""A stand-in for one vLLM replica, run as a process behind the real vllm-router in unit tests.

    python tests/fake_replica.py PORT MODEL

Serves /health, /v1/models (MODEL), /v1/chat/completions (a valid reply with logprobs and
usage, from faulty_server) and GET /sessions: the `X-Session-ID` of every chat request it
answered, in order, so a test sees which replica served which question.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faulty_server import chat_reply

SESSIONS: list[str | None] = []
LOCK = threading.Lock()


def serve(port: int, model: str) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            return

        def _send(self, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.endswith("/models"):
                self._send({"object": "list", "data": [{"id": model, "object": "model"}]})
            elif self.path == "/sessions":
                with LOCK:
                    self._send(list(SESSIONS))
            else:
                self._send({})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with LOCK:
                SESSIONS.append(self.headers.get("X-Session-ID"))
            reply = chat_reply()
            reply["model"] = model
            self._send(reply)

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2])
