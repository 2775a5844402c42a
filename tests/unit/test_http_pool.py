"""Keep-alive connections per event loop (servers.clients.http_pool): a loop's requests share
connections, a later loop gets its own (no "Event loop is closed"), and a loop's shutdown
closes its pool."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
from langchain_core.messages import HumanMessage

from faulty_server import faulty_server
from mur.servers.clients.chat_models import make_chat_model
from mur.servers.clients.http_pool import LoopPools, sdk_http_module


def test_a_loop_reuses_its_connections_and_a_new_loop_gets_its_own() -> None:
    with faulty_server(["ok"]) as server:
        accepted: list[Any] = []
        serve = server.httpd.process_request

        def counting(request: Any, address: Any) -> None:
            accepted.append(address)
            serve(request, address)

        server.httpd.process_request = counting  # type: ignore[method-assign]
        pools = LoopPools(sdk_http_module())
        client = openai.DefaultAsyncHttpxClient(transport=pools)  # type: ignore[arg-type]
        model = make_chat_model(server.base_url, "m", http_async_client=client)

        async def three_in_turn() -> None:
            for _ in range(3):
                await model.ainvoke([HumanMessage("q")])
            assert pools.open_pools == 1

        asyncio.run(three_in_turn())
        assert len(accepted) == 1  # one connection carried the loop's three requests
        assert pools.open_pools == 0  # closed with its loop
        asyncio.run(three_in_turn())  # a closed loop's connection is never reused
        assert len(accepted) == 2
        assert server.answered == 6 and server.faults == 0
