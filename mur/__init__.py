"""MUR: Momentum Uncertainty guided Reasoning as a LangGraph workflow over vLLM servers.

The public API for an app that embeds the method:

    from mur import ChatMUR, Context, MURMiddleware, build_graph, mur_tool, tune_collector

`ChatMUR` is the graph as a LangChain chat model, `mur_tool` as an agent's tool
(integrations/chat_model.py), `MURMiddleware` MUR's gate over an agent's own model calls
(integrations/middleware.py); `build_graph` the compiled graph to mount as a node of your own.

The repository keeps its rooms at its root (graphs/, nodes/, prompts/, servers/, ...); this
package names them `mur.graphs`, `mur.nodes`, ... through symbolic links, so the installed
program, the type checker, the import contracts and the tests all see the same names.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mur.graphs.mur import build_graph
    from mur.graphs.state import Context
    from mur.integrations.chat_model import ChatMUR, mur_tool
    from mur.integrations.middleware import MURMiddleware
    from mur.servers.clients.collector import tune_collector

__all__ = ["ChatMUR", "Context", "MURMiddleware", "build_graph", "mur_tool", "tune_collector"]

# Where each public name lives: imported on first use, so `mur servers status` or `mur --help`
# does not pay for LangGraph.
_PUBLIC = {
    "ChatMUR": "mur.integrations.chat_model",
    "mur_tool": "mur.integrations.chat_model",
    "MURMiddleware": "mur.integrations.middleware",
    "Context": "mur.graphs.state",
    "build_graph": "mur.graphs.mur",
    "tune_collector": "mur.servers.clients.collector",
}


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'mur' has no attribute {name!r}")
    return getattr(import_module(_PUBLIC[name]), name)
