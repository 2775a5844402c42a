"""The bounded load test of the endpoint (benchmarks/endpoint_load.py) over the scripted
backbone, as CI runs it: 64 concurrent clients, streaming and not, injected faults; and a
saturated endpoint whose 429s the clients retry. Zero lost, duplicated or wrong replies, and
no 5xx but the injected ones."""

from __future__ import annotations

import socket

from mur.benchmarks.endpoint_load import Ask, Outcome, Report, plan, problems_of, run, summarize
from mur.cli.bench.endpoint_load import build_parser
from mur.testing.fake_endpoint import expected_content


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load(*flags: str) -> Report:
    args = build_parser().parse_args(["--backbone", "fake", "--port", str(free_port()), *flags])
    return run(args)


def test_the_plan_mixes_streams_models_and_faults() -> None:
    asks = plan(40, stream_share=0.5, fault_share=0.1)
    assert sum(a.stream for a in asks) == 20
    assert {a.model for a in asks} == {"mur-critic", "mur-critic-never"}
    faults = [a for a in asks if a.fault_step]
    assert len(faults) == 4 and {a.fault_step for a in faults if a.stream} <= {1, 2}
    assert {a.fault_step for a in faults if not a.stream} == {1}


def test_64_clients_over_the_fake_backbone_lose_and_duplicate_nothing() -> None:
    report = load("--clients", "64", "--requests", "192")
    assert report.requests == 192 and report.streamed == 96 and report.injected == 9
    assert report.ok == 192 - report.injected
    assert (report.lost, report.duplicated, report.unexpected_5xx, report.wrong) == (0, 0, 0, 0)
    assert report.throttled == 0 and report.passed, report.problems


def test_a_saturated_endpoint_answers_429_and_retried_clients_all_get_through() -> None:
    report = load("--clients", "24", "--requests", "48", "--max-runs", "4")
    assert report.throttled > 0
    assert (report.lost, report.duplicated, report.unexpected_5xx, report.wrong) == (0, 0, 0, 0)
    assert report.passed, report.problems


def test_the_checks_catch_lost_duplicated_wrong_and_uninjected_5xx_replies() -> None:
    """The checker itself, on made-up outcomes: each kind of failure is counted."""
    ok_ask, other_ask, faulty, streamed = plan(40, stream_share=0.5, fault_share=0.05)[1:5]

    def reply(ask: Ask, number: int, cid: str) -> Outcome:
        content = expected_content(number, ask.model == "mur-critic")
        steps = [
            {"index": int(line[4]), "text": line.split(": ", 1)[1]} for line in content.splitlines()
        ]
        trace = {"steps": steps, "usage": {"backbone_tokens": 5, "external_tokens": 0}}
        return Outcome(ask, status=200, ids=[cid], content=content, trace=trace)

    good = reply(ok_ask, ok_ask.number, "a")
    assert problems_of(good, "fake") == []
    swapped = reply(other_ask, ok_ask.number, "b")  # another request's content
    duplicate = reply(streamed, streamed.number, "a")  # an id already seen
    duplicate.ask = Ask(streamed.number, streamed.model, False, None)
    lost = Outcome(faulty, status=0, error="ReadTimeout")
    uninjected = Outcome(Ask(7, "mur-critic", False, None), status=502, error="boom")
    report = summarize("fake", 4, [good, swapped, duplicate, lost, uninjected], 1.0, None)
    assert (report.lost, report.duplicated, report.unexpected_5xx) == (1, 1, 1)
    assert report.wrong == 1 and not report.passed
