"""The stock ChatOpenAI's translation of the OpenAI SDK's errors into LangChain's classes
(a context overflow as `ContextOverflowError`, a 404 as a model-not-found error, ...).

langchain-openai keeps it private (`_handle_openai_bad_request`, `_handle_openai_api_error`);
the lean request path (chat_models.py) sends its own requests and must raise what the stock
path raises, so it goes through this one function. An upgrade of langchain-openai that moves
them fails tests/unit/test_private_apis.py; a user's request then still gets the SDK's own
error (not pinned tighter than `<2`: an app that embeds ChatMUR keeps its own upgrades).
"""

from __future__ import annotations

from typing import NoReturn

import openai
from langchain_openai.chat_models import base as stock


def raise_as_stock(exc: openai.APIError) -> NoReturn:
    """Raise `exc` as ChatOpenAI would: LangChain's class for it, else `exc` itself."""
    bad_request = getattr(stock, "_handle_openai_bad_request", None)
    api_error = getattr(stock, "_handle_openai_api_error", None)
    if bad_request is not None and isinstance(exc, openai.BadRequestError):
        bad_request(exc)
    try:
        raise exc
    except openai.APIError:  # the stock handler re-raises the exception being handled
        if api_error is not None:
            api_error(exc)
        raise
