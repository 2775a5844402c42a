"""The MUR endpoint over the real CPU vLLM server: one short completion, end to end.

Kept to a single small request: the server is shared and slow (2 CPU cores).
"""

from __future__ import annotations

import time

import openai
import pytest

from servers.connect import connect
from servers.mur_endpoint import create_app, running

pytestmark = pytest.mark.integration

SMALL = {"max_steps": 2, "max_step_tokens": 48, "judge_max_tokens": 32}


def test_one_real_completion_through_the_endpoint(cpu_server, generated_tokens) -> None:
    app = create_app(connect(base_url=cpu_server.base_url, model=cpu_server.model).backbone)
    with running(app) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
        reply = client.chat.completions.create(
            model="mur-critic",
            messages=[
                {"role": "system", "content": "You are a helpful math assistant."},
                {"role": "user", "content": "If 2x + 3 = 11, what is x?"},
            ],
            extra_body={"mur": SMALL},
        )
    trace = reply.model_extra["mur"]
    steps = trace["steps"]
    assert 1 <= len(steps) <= 2
    assert [s["index"] for s in steps] == list(range(1, len(steps) + 1))
    assert not steps[0]["scaled"]  # the gamma-gate never scales step 1
    assert all(s["num_tokens"] > 0 and s["uncertainty"] > 0 for s in steps)
    assert trace["config"]["strategy"] == "critic" and trace["config"]["gate"] == "mur"
    assert {k: trace["config"][k] for k in SMALL} == SMALL
    content = reply.choices[0].message.content
    assert content.startswith("Step1: ") and reply.choices[0].finish_reason == "stop"
    usage = trace["usage"]
    completion = usage["backbone_tokens"] + usage["external_tokens"]
    assert reply.usage.completion_tokens == completion > 0
    # Exactly what the server generated (integration tests hold the server alone; its
    # counter is read until it settles, at most 5 s).
    deadline = time.monotonic() + 5
    while generated_tokens() != completion and time.monotonic() < deadline:
        time.sleep(0.2)
    assert generated_tokens() == completion
