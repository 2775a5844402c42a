"""Durable endpoint runs over SQLite: keyed runs checkpointed, keyless ones not, idempotency keys,
leases, pruning.

Real uvicorn, the scripted fake as backbone (model `mur-critic-never`: drafts at steps 1 and 2,
the answer at step 3), the checkpointer an SQLite file of the test's own, read by the test
with the standard library to see what the endpoint left in it. Computation is counted by the
fake's calls: a replay makes none, a resumed run asks only for the steps it had not kept.
"""

from __future__ import annotations

import json
import re
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.messages import BaseMessage

from asgi_server import running
from fakes import FakeLogprobChat, Scripted
from mur.cli.endpoint import PROG, build_parser, checkpointer_target, main
from mur.endpoint import create_app
from mur.endpoint.refusals import lease_lost
from mur.persistence.checkpointers import CheckpointerUnavailable
from waiting import wait_until

MODEL = "mur-critic-never"
QUESTION = [{"role": "user", "content": "What is 6 * 7?"}]
CONTENT = "Step1: draft step 1\nStep2: draft step 2\nStep3: So the answer is 42.\n"
ALICE, BOB = "alice-key-0001", "bob-key-0002"


class Backbone:
    """The scripted backbone: drafts at steps 1 and 2, the answer at step 3; step `fail_at`
    raises while `failing` is set, step `hold_at` waits for `release` (`held` is set once it
    waits); `asked()` lists the step of every call, in order."""

    def __init__(self, fail_at: int | None = None, hold_at: int | None = None) -> None:
        self.fail_at, self.hold_at = fail_at, hold_at
        self.failing, self.release = threading.Event(), threading.Event()
        self.held = threading.Event()
        self.failing.set()
        self.fake = FakeLogprobChat(responder=self.respond)

    @staticmethod
    def step_of(messages: list[BaseMessage]) -> int:
        found = re.findall(r"Step(\d+):$", str(messages[-1].content))
        return int(found[-1]) if found else 0

    def respond(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> Scripted:
        index = self.step_of(messages)
        if index == self.fail_at and self.failing.is_set():
            raise RuntimeError(f"scripted failure at step {index}")
        if index == self.hold_at:
            self.held.set()
            self.release.wait(timeout=30)
        if index >= 3:
            return Scripted(" So the answer is 42.", [-0.2] * 6, stop_reason=None)
        return Scripted(f" draft step {index}", [-0.5] * 4)

    def asked(self) -> list[int]:
        return [self.step_of(call["messages"]) for call in self.fake.calls]


def ask(
    url: str,
    key: str | None = None,
    *,
    api_key: str | None = None,
    timeout: float = 30,
    **body: Any,
) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    payload = {"model": MODEL, "messages": QUESTION, **body}
    return httpx.post(f"{url}/chat/completions", json=payload, headers=headers, timeout=timeout)


def leave_once(url: str, key: str, reached: threading.Event) -> None:
    """Ask for a whole reply and close the connection once `reached` is set: a client that gives
    up mid-run, at a known step however slowly a loaded machine gets there (a client timeout
    could fire before)."""
    target = httpx.URL(url)
    body = json.dumps({"model": MODEL, "messages": QUESTION}).encode()
    head = (
        f"POST {target.path}/chat/completions HTTP/1.1\r\nHost: {target.host}\r\n"
        f"Content-Type: application/json\r\nIdempotency-Key: {key}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection((target.host, target.port), timeout=30) as connection:
        connection.sendall(head.encode() + body)
        assert reached.wait(30), f"the run of {key!r} never reached the step it should leave at"


def rows(database: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(database) as conn:
        return conn.execute(sql, params).fetchall()


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return tmp_path / "runs.sqlite"


@pytest.fixture
def serve(database: Path) -> Iterator[Callable[..., tuple[str, Any]]]:
    """serve(backbone, **create_app options) -> (base URL, app), over the test's database."""
    with_servers: list[Any] = []

    def start(backbone: Backbone, **options: Any) -> tuple[str, Any]:
        app = create_app(backbone.fake, checkpointer=str(database), **options)
        server = running(app)
        with_servers.append(server)
        return server.__enter__(), app

    yield start
    for server in reversed(with_servers):
        server.__exit__(None, None, None)


# ------------------------------------------------------------------ one key, one run


def test_the_same_key_twice_is_one_computation(serve: Callable[..., tuple[str, Any]]) -> None:
    backbone = Backbone()
    url, _ = serve(backbone)
    first = ask(url, "order-1")
    assert first.status_code == 200 and backbone.asked() == [1, 2, 3]
    again = ask(url, "order-1")
    in_field = ask(url, mur={"idempotency_key": "order-1"})
    assert backbone.asked() == [1, 2, 3], "a retry of a finished run computed again"
    reply, replay = first.json(), again.json()
    assert replay["id"] == reply["id"] and replay["created"] == reply["created"]
    assert (
        replay["choices"] == reply["choices"]
        and reply["choices"][0]["message"]["content"] == CONTENT
    )
    assert in_field.json()["id"] == reply["id"]
    # usage: this request's tokens; mur.usage_total: the whole run's, counted once.
    assert (
        reply["usage"] == reply["mur"]["usage_total"] and reply["usage"]["completion_tokens"] == 14
    )
    assert replay["usage"]["completion_tokens"] == 0 and replay["usage"]["total_tokens"] == 0
    assert replay["mur"]["usage_total"] == reply["mur"]["usage_total"]
    assert (reply["mur"]["run"], replay["mur"]["run"]) == (
        {"outcome": "new", "idempotency_key": "order-1"},
        {"outcome": "replayed", "idempotency_key": "order-1"},
    )
    other = ask(url, "order-2")
    assert other.json()["id"] != reply["id"] and backbone.asked() == [1, 2, 3] * 2


def test_a_retry_streams_the_recorded_reply(serve: Callable[..., tuple[str, Any]]) -> None:
    backbone = Backbone()
    url, _ = serve(backbone)
    reply = ask(url, "stream-me").json()
    body = {"model": MODEL, "messages": QUESTION, "stream": True}
    body["stream_options"] = {"include_usage": True}
    with httpx.stream(
        "POST", f"{url}/chat/completions", json=body, headers={"Idempotency-Key": "stream-me"}
    ) as streamed:
        chunks = [line.removeprefix("data: ") for line in streamed.iter_lines() if line]
    assert chunks[-1] == "[DONE]"
    parsed = [json.loads(c) for c in chunks[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in parsed if c["choices"])
    assert text == CONTENT and {c["id"] for c in parsed} == {reply["id"]}
    assert all(c["mur_step"]["restored"] for c in parsed[:3])
    assert parsed[-2]["mur"]["run"]["outcome"] == "replayed"
    assert parsed[-1]["usage"]["completion_tokens"] == 0
    assert backbone.asked() == [1, 2, 3]


def test_a_key_reused_for_another_request_is_422(serve: Callable[..., tuple[str, Any]]) -> None:
    """Neither a stopped run (free to resume) nor a finished one is given to another body."""
    backbone = Backbone(fail_at=3)
    url, _ = serve(backbone)
    assert ask(url, "k-422").status_code == 502  # stopped after step 2
    backbone.failing.clear()
    other_question = ask(url, "k-422", messages=[{"role": "user", "content": "And 6 * 8?"}])
    assert ask(url, "k-422").json()["mur"]["run"]["outcome"] == "resumed"
    other_settings = ask(url, "k-422", mur={"max_steps": 5})
    for refused in (other_question, other_settings):
        assert refused.status_code == 422
        error = refused.json()["error"]
        assert error["code"] == "idempotency_key_reused" and "'k-422'" in error["message"]
    assert ask(url, "k-422", stream=True).status_code == 200  # streaming is no other request
    assert backbone.asked() == [1, 2, 3, 3]


def test_a_retry_that_means_the_same_is_the_same_request(
    serve: Callable[..., tuple[str, Any]],
) -> None:
    """The fingerprint reads the request as the endpoint does: `"mur": {}` is no `mur`, the
    content as text parts is the content as a string, a setting given at its default is the
    default; each retry gets the first reply, nothing is computed again."""
    backbone = Backbone()
    url, _ = serve(backbone)
    first = ask(url, "same-1")
    parts = [{"role": "user", "content": [{"type": "text", "text": QUESTION[0]["content"]}]}]
    retries = [
        ask(url, "same-1", mur={}),
        ask(url, "same-1", messages=parts),
        ask(url, "same-1", mur={"strategy": "critic", "gate": "never"}),
    ]
    assert [reply.status_code for reply in retries] == [200, 200, 200]
    assert {reply.json()["id"] for reply in retries} == {first.json()["id"]}
    assert backbone.asked() == [1, 2, 3]


def test_an_idempotency_key_sent_twice_is_400_naming_the_header(
    serve: Callable[..., tuple[str, Any]],
) -> None:
    url, _ = serve(Backbone())
    headers = [("Idempotency-Key", "a-1"), ("Idempotency-Key", "a-2")]
    body = {"model": MODEL, "messages": QUESTION}
    reply = httpx.post(f"{url}/chat/completions", json=body, headers=headers)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "Idempotency-Key"
    assert error["message"] == "the Idempotency-Key header was sent 2 times: send it once"


def test_a_run_being_pruned_answers_that_it_expired(
    serve: Callable[..., tuple[str, Any]], database: Path
) -> None:
    """A retry while the key's finished run is being deleted (its row marked `pruning`) is told
    so, with a second to wait; once it is gone the key runs afresh."""
    backbone = Backbone()
    url, _ = serve(backbone)
    assert ask(url, "old-1").status_code == 200
    with sqlite3.connect(database) as conn:  # what mark_prunable leaves while it deletes
        conn.execute("UPDATE mur_runs SET status = 'pruning'")
    reply = ask(url, "old-1")
    assert reply.status_code == 409 and reply.headers["retry-after"] == "1"
    error = reply.json()["error"]
    assert error["code"] == "run_expired" and "is being deleted" in error["message"]
    with sqlite3.connect(database) as conn:  # the prune done
        for table in ("checkpoints", "writes", "mur_runs"):
            conn.execute(f"DELETE FROM {table}")  # fixed names
    assert ask(url, "old-1").json()["mur"]["run"]["outcome"] == "new"


@pytest.mark.parametrize(
    ("headers", "mur", "param"),
    [
        ({"Idempotency-Key": "x" * 256}, None, "Idempotency-Key"),
        ({"Idempotency-Key": "clé".encode("latin-1")}, None, "Idempotency-Key"),
        ({}, {"idempotency_key": "  "}, "mur.idempotency_key"),
        ({}, {"idempotency_key": 7}, "mur.idempotency_key"),
        ({"Idempotency-Key": "a"}, {"idempotency_key": "b"}, "mur.idempotency_key"),
    ],
    ids=["too long", "not ascii", "blank", "not a string", "header and field differ"],
)
def test_a_bad_idempotency_key_is_400(
    serve: Callable[..., tuple[str, Any]], headers: dict[str, Any], mur: Any, param: str
) -> None:
    url, _ = serve(Backbone())
    body: dict[str, Any] = {"model": MODEL, "messages": QUESTION, "mur": mur}
    reply = httpx.post(f"{url}/chat/completions", json=body, headers=headers)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param


# ------------------------------------------------------------------------- callers


def test_keys_are_scoped_to_the_callers_api_key(serve: Callable[..., tuple[str, Any]]) -> None:
    """Bob sending Alice's idempotency key gets a run of his own: he neither reads her reply
    nor resumes her stopped run; Alice then resumes hers."""
    backbone = Backbone(fail_at=3)
    url, _ = serve(backbone, api_key=[ALICE, BOB])
    assert ask(url, "shared", api_key=ALICE).status_code == 502  # stopped at step 3
    assert backbone.asked() == [1, 2, 3]
    backbone.failing.clear()
    bob = ask(url, "shared", api_key=BOB).json()
    assert bob["mur"]["run"]["outcome"] == "new"
    assert backbone.asked()[3:] == [1, 2, 3], "Bob resumed Alice's run"
    alice = ask(url, "shared", api_key=ALICE).json()
    assert alice["mur"]["run"]["outcome"] == "resumed" and backbone.asked()[6:] == [3]
    assert ask(url, "shared", api_key=BOB).json()["id"] == bob["id"] != alice["id"]
    assert ask(url, "shared", api_key=ALICE).json()["id"] == alice["id"]
    assert ask(url, "shared", api_key="carol").status_code == 401


# -------------------------------------------------------------------------- resume


def test_a_stopped_run_resumes_after_its_last_finished_node(
    serve: Callable[..., tuple[str, Any]],
) -> None:
    backbone = Backbone(fail_at=3)
    url, _ = serve(backbone)
    failed = ask(url, "resume-me")
    assert failed.status_code == 502 and "scripted failure" in failed.json()["error"]["message"]
    backbone.failing.clear()
    resumed = ask(url, "resume-me").json()
    assert backbone.asked() == [1, 2, 3, 3], "steps 1 and 2 were computed again"
    assert resumed["choices"][0]["message"]["content"] == CONTENT
    assert resumed["mur"]["run"]["outcome"] == "resumed"
    # This request generated step 3 (6 tokens); the run, all three steps, each counted once.
    assert resumed["usage"]["completion_tokens"] == 6
    assert resumed["mur"]["usage_total"]["completion_tokens"] == 14
    assert ask(url, "resume-me").json()["id"] == resumed["id"]


def test_a_resumed_stream_sends_the_kept_steps_then_the_new_ones(
    serve: Callable[..., tuple[str, Any]],
) -> None:
    backbone = Backbone(fail_at=3)
    url, _ = serve(backbone)
    assert ask(url, "stream-resume").status_code == 502
    backbone.failing.clear()
    body = {"model": MODEL, "messages": QUESTION, "stream": True}
    with httpx.stream(
        "POST", f"{url}/chat/completions", json=body, headers={"Idempotency-Key": "stream-resume"}
    ) as streamed:
        chunks = [line.removeprefix("data: ") for line in streamed.iter_lines() if line]
    parsed = [json.loads(c) for c in chunks[:-1]]
    steps = [c["mur_step"] for c in parsed if "mur_step" in c]
    assert [(s["index"], s.get("restored", False)) for s in steps] == [
        (1, True),
        (2, True),
        (3, False),
    ]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in parsed) == CONTENT
    assert parsed[-1]["mur"]["run"]["outcome"] == "resumed"
    assert backbone.asked() == [1, 2, 3, 3]


def test_a_run_its_client_left_is_freed_and_its_retry_resumes_at_once(
    serve: Callable[..., tuple[str, Any]], database: Path
) -> None:
    """The client gives up during step 2: the run is cancelled, its claim freed (no 409, no
    lease to wait for), and the retry recomputes only the node that was in flight."""
    backbone = Backbone(hold_at=2)
    url, app = serve(backbone, lease_seconds=30)
    leave_once(url, "impatient", backbone.held)
    assert wait_until(lambda: app.state.service.in_flight == 0, 5)
    assert rows(database, "SELECT status FROM mur_runs") == [("failed",)]
    backbone.release.set()
    retry = ask(url, "impatient")
    assert retry.status_code == 200 and retry.json()["mur"]["run"]["outcome"] == "resumed"
    assert backbone.asked() == [1, 2, 2, 3]
    assert retry.json()["choices"][0]["message"]["content"] == CONTENT


def test_a_draining_replica_takes_no_new_run(serve: Callable[..., tuple[str, Any]]) -> None:
    url, app = serve(Backbone())
    app.state.service.stop_taking_runs()
    refused = ask(url, "late")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
    assert refused.headers["retry-after"] == "1"


# -------------------------------------------------------------------------- leases


def test_a_key_whose_run_is_still_running_gets_409_with_retry_after(
    serve: Callable[..., tuple[str, Any]],
) -> None:
    backbone = Backbone(hold_at=2)
    url, app = serve(backbone, lease_seconds=3)
    first: list[httpx.Response] = []
    holder = threading.Thread(target=lambda: first.append(ask(url, "busy")))
    holder.start()
    try:
        assert wait_until(lambda: app.state.service.in_flight == 1, 5)
        refused = ask(url, "busy")
    finally:
        backbone.release.set()
        holder.join(30)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "run_in_progress"
    assert 1 <= int(refused.headers["retry-after"]) <= 3 and "'busy'" in refused.text
    assert first[0].status_code == 200
    assert ask(url, "busy").json()["id"] == first[0].json()["id"]
    assert backbone.asked() == [1, 2, 3]


def test_a_dead_replicas_run_is_taken_over_once_its_lease_expires(
    serve: Callable[..., tuple[str, Any]], database: Path
) -> None:
    """The run stopped at step 3; the ledger then says another replica holds it with a lease
    it no longer renews (it died). Until the lease ends: 409; then this replica resumes it."""
    backbone = Backbone(fail_at=3)
    url, _ = serve(backbone, replica_id="replica-b")
    assert ask(url, "orphan").status_code == 502
    backbone.failing.clear()
    rows(
        database,
        "UPDATE mur_runs SET status = 'running', owner = 'replica-a', "
        "lease_expires = (julianday('now') - 2440587.5) * 86400.0 + 1.5",
    )
    refused = ask(url, "orphan")
    assert refused.status_code == 409 and int(refused.headers["retry-after"]) in (1, 2)
    time.sleep(1.6)
    taken = ask(url, "orphan").json()
    assert taken["mur"]["run"]["outcome"] == "resumed" and backbone.asked() == [1, 2, 3, 3]
    assert rows(database, "SELECT owner, status, claims FROM mur_runs") == [
        ("replica-b", "finished", 2)
    ]


def test_a_run_whose_lease_was_taken_over_stops_and_answers_409(
    serve: Callable[..., tuple[str, Any]], database: Path
) -> None:
    """This replica stalled past its lease and another took the run: the lease renewal finds
    it lost and cancels the run while its model call is still in flight, so the step after the
    takeover is never asked of the backbone and only the new owner's reply is ever recorded."""
    backbone = Backbone(hold_at=2)
    url, app = serve(backbone, lease_seconds=0.6)
    answers: list[httpx.Response] = []
    holder = threading.Thread(target=lambda: answers.append(ask(url, "stolen")))
    holder.start()
    try:
        assert wait_until(lambda: backbone.asked() == [1, 2], 5)
        rows(database, "UPDATE mur_runs SET owner = 'replica-z'")
        holder.join(5)  # renewals come every 0.2 s
        answered_while_held = bool(answers)
    finally:
        backbone.release.set()
        holder.join(30)
    assert answered_while_held, "the run went on after its lease was lost"
    assert answers[0].status_code == 409
    assert answers[0].json()["error"]["code"] == "run_taken_over"
    assert wait_until(lambda: app.state.service.in_flight == 0, 10)
    assert backbone.asked() == [1, 2], "the step after the takeover was asked of the backbone"
    assert rows(database, "SELECT owner, status FROM mur_runs") == [("replica-z", "running")]


def claims_of_checkpoints(database: Path) -> list[int]:
    """The claim that wrote each checkpoint (its metadata's `mur_claim`), in order."""
    found = rows(database, "SELECT metadata FROM checkpoints ORDER BY checkpoint_id")
    return [json.loads(metadata)["mur_claim"] for (metadata,) in found]


def test_two_live_replicas_given_one_key_never_both_go_on(
    serve: Callable[..., tuple[str, Any]], database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica A's lease renewals fail (its database link is down for them) during a long
    model call. A stops the run itself before its lease could lapse (5/6 of a lease without a
    confirmed renewal) and answers 503 naming the database; the client's retry reaches
    replica B, which resumes the run after A's last checkpoint and finishes it. A asks no
    step after it stopped; the key answers B's reply everywhere."""
    stalled, healthy = Backbone(hold_at=2), Backbone()
    url_a, app_a = serve(stalled, replica_id="replica-a", lease_seconds=1)
    url_b, _ = serve(healthy, replica_id="replica-b", lease_seconds=1)

    async def renewals_fail(lease: float, claims: Any) -> set[Any]:
        raise CheckpointerUnavailable("the checkpointer is unavailable: cut off by the test")

    monkeypatch.setattr(app_a.state.service.durable.ledger, "renew", renewals_fail)
    answers: list[httpx.Response] = []
    holder = threading.Thread(target=lambda: answers.append(ask(url_a, "twice")))
    holder.start()
    try:
        assert wait_until(lambda: stalled.asked() == [1, 2], 5)
        holder.join(5)
        assert not holder.is_alive(), "A went on with a lease it could not renew"
        taken = ask(url_b, "twice")
    finally:
        stalled.release.set()
        holder.join(30)
    assert [answer.status_code for answer in answers] == [503]
    error = answers[0].json()["error"]
    assert error["code"] == "checkpointer_unavailable"
    assert "did not renew this run's lease for 0.8 s" in error["message"]
    assert taken.status_code == 200 and taken.json()["mur"]["run"]["outcome"] == "resumed"
    assert healthy.asked() == [2, 3]
    assert wait_until(lambda: app_a.state.service.in_flight == 0, 10)
    assert stalled.asked() == [1, 2], "replica A asked the step after it stopped"
    assert set(claims_of_checkpoints(database)) == {1, 2}  # A's up to step 1, then B's
    assert rows(database, "SELECT owner, status, claims FROM mur_runs") == [
        ("replica-b", "finished", 2)
    ]
    assert ask(url_a, "twice").json()["id"] == taken.json()["id"]


# ------------------------------------------------------------- checkpoints, pruning


def count_rows(database: Path) -> dict[str, int]:
    """Rows in LangGraph's two SQLite tables and in the run ledger."""
    return {
        table: rows(database, f"SELECT COUNT(*) FROM {table}")[0][0]
        for table in ("checkpoints", "writes", "mur_runs")
    }


def streamed_chunks(url: str, key: str | None = None) -> list[dict[str, Any]]:
    """A whole stream (with its usage chunk), its JSON chunks; it must end with [DONE]."""
    body = {"model": MODEL, "messages": QUESTION, "stream": True}
    body["stream_options"] = {"include_usage": True}
    headers = {"Idempotency-Key": key} if key is not None else {}
    with httpx.stream("POST", f"{url}/chat/completions", json=body, headers=headers) as streamed:
        chunks = [line.removeprefix("data: ") for line in streamed.iter_lines() if line]
    assert chunks[-1] == "[DONE]"
    return [json.loads(chunk) for chunk in chunks[:-1]]


def test_a_run_without_a_key_writes_no_checkpoint_and_no_ledger_row(
    serve: Callable[..., tuple[str, Any]], database: Path
) -> None:
    """The OpenAI SDK sends no Idempotency-Key. Such a run can never be resumed or replayed,
    so it writes nothing: no checkpoint and no ledger row while it runs (held at step 2, when
    a checkpointed run has written step 1's) or after. Its reply is whole, its usage exact
    (the same as a keyed run's), and it says it has no key; streamed too."""
    backbone = Backbone(hold_at=2)
    url, _ = serve(backbone)
    answers: list[httpx.Response] = []
    holder = threading.Thread(target=lambda: answers.append(ask(url)))
    holder.start()
    try:
        assert backbone.held.wait(5), "step 2 was not asked for"
        while_running = count_rows(database)
    finally:
        backbone.release.set()
        holder.join(30)
    assert while_running == {"checkpoints": 0, "writes": 0, "mur_runs": 0}
    reply = answers[0].json()
    assert answers[0].status_code == 200 and reply["choices"][0]["message"]["content"] == CONTENT
    assert reply["mur"]["run"] == {"outcome": "new", "idempotency_key": None}
    assert reply["usage"] == reply["mur"]["usage_total"]
    assert reply["usage"]["completion_tokens"] == 14
    parsed = streamed_chunks(url)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in parsed if c["choices"])
    assert text == CONTENT
    assert parsed[-2]["mur"]["run"] == {"outcome": "new", "idempotency_key": None}
    assert parsed[-1]["usage"] == reply["usage"]
    assert backbone.asked() == [1, 2, 3] * 2
    assert count_rows(database) == {"checkpoints": 0, "writes": 0, "mur_runs": 0}
    keyed = ask(url, "with-a-key").json()  # the same endpoint checkpoints a keyed run
    assert keyed["usage"] == reply["usage"] and keyed["mur"]["run"]["idempotency_key"]
    after = count_rows(database)
    assert after["checkpoints"] > 0 and after["writes"] > 0 and after["mur_runs"] == 1


def test_a_run_without_a_key_needs_no_database(
    serve: Callable[..., tuple[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyless run is claimed nowhere: with the ledger's database not answering, it is
    answered all the same, while a keyed request gets 503 naming the checkpointer."""
    backbone = Backbone()
    url, app = serve(backbone)

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise CheckpointerUnavailable("the checkpointer is unavailable: cut off by the test")

    monkeypatch.setattr(app.state.service.store.database, "execute", down)
    keyless, keyed = ask(url), ask(url, "needs-the-ledger")
    assert (
        keyless.status_code == 200 and keyless.json()["choices"][0]["message"]["content"] == CONTENT
    )
    assert keyed.status_code == 503
    assert keyed.json()["error"]["code"] == "checkpointer_unavailable"
    assert backbone.asked() == [1, 2, 3]


def test_a_keyless_run_stopped_as_taken_over_is_told_to_send_a_key() -> None:
    """lease_lost's wording: with a key, retry it; without one (a keyless run has no claim to
    lose, but were it ever stopped so), no "idempotency key None" but what to do instead."""
    keyed = lease_lost("order-7")
    assert keyed.status == 409 and "'order-7'" in keyed.message
    assert "retry with the same key" in keyed.message
    keyless = lease_lost(None)
    assert keyless.status == 409 and keyless.headers == {"Retry-After": "1"}
    assert "None" not in keyless.message and "same key" not in keyless.message
    assert keyless.message.startswith("this run (sent without an Idempotency-Key)")
    assert "retry with an Idempotency-Key header to make a run resumable" in keyless.message


def test_finished_runs_are_pruned_after_keep_finished(
    serve: Callable[..., tuple[str, Any]], database: Path
) -> None:
    backbone = Backbone()
    keep = 0.5
    url, _ = serve(backbone, lease_seconds=0.5, keep_finished=keep)
    asked = time.monotonic()  # before the run, so no machine is too slow for the bound below
    first = ask(url, "short-lived").json()
    assert rows(database, "SELECT status FROM mur_runs") == [("finished",)]
    assert rows(database, "SELECT COUNT(*) FROM checkpoints")[0][0] > 0
    assert wait_until(lambda: not rows(database, "SELECT * FROM mur_runs"), 10)
    # Kept for keep_finished after it finished, which was after it was asked (a tenth of it
    # spared for the wall clock the ledger keeps its times in).
    assert time.monotonic() - asked >= 0.9 * keep, "pruned before keep_finished"
    assert rows(database, "SELECT COUNT(*) FROM checkpoints") == [(0,)]
    assert rows(database, "SELECT COUNT(*) FROM writes") == [(0,)]
    again = ask(url, "short-lived").json()  # the key is free again: a new run
    assert again["mur"]["run"]["outcome"] == "new" and again["id"] != first["id"]
    assert backbone.asked() == [1, 2, 3] * 2


# ----------------------------------------------------------------------- the command


def test_the_checkpointer_comes_from_the_flag_the_variable_or_mur_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MUR_HOME", str(tmp_path))
    monkeypatch.delenv("MUR_CHECKPOINTER", raising=False)
    parse = build_parser().parse_args
    assert checkpointer_target(parse([])) == str(tmp_path / "endpoint" / "checkpoints.sqlite")
    monkeypatch.setenv("MUR_CHECKPOINTER", "postgresql://u@db/mur")
    assert checkpointer_target(parse([])) == "postgresql://u@db/mur"
    assert checkpointer_target(parse(["--checkpointer", "x.sqlite"])) == "x.sqlite"


@pytest.mark.parametrize(
    "target",
    ["mysql://mur:s3cret-pw@db/mur", "postgresql://mur:s3cret-pw@127.0.0.1:notaport/mur"],
    ids=["unknown kind", "bad port"],
)
def test_a_bad_checkpointer_stops_the_endpoint_with_one_line(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--checkpointer", target]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"{PROG}: ")
    assert "mur:***@" in err and "s3cret-pw" not in captured.out + captured.err
