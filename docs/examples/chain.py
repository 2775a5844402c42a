"""ChatMUR in an LCEL chain: a prompt, MUR as the chat model, a parser.

    python docs/examples/chain.py "What is 3^4 - 2^5?"

The backbone is the embedded CPU server (started if it is not running), or the server
MUR_BASE_URL names (a GPU vLLM server with Qwen3, say). ChatMUR goes where any chat model
goes: `invoke`, `astream` (a chunk per kept step), `batch`, callbacks and LangSmith.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable

from mur import ChatMUR
from mur.servers.connect import connect

PROMPT = ChatPromptTemplate.from_messages(
    [("system", "You are a careful math tutor."), ("user", "{question}")]
)


def build_chain(llm: ChatMUR) -> Runnable[dict[str, Any], str]:
    """prompt | MUR | the reply's text (the reasoning, then the answer)."""
    return PROMPT | llm | StrOutputParser()


def main(argv: Sequence[str] | None = None) -> int:
    question = " ".join(argv if argv is not None else sys.argv[1:]) or "What is 3^4 - 2^5?"
    servers = connect(start=True, progress=True)
    llm = ChatMUR(backbone=servers.backbone, verifier=servers.verifier, strategy="critic")
    print(build_chain(llm).invoke({"question": question}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
