"""The graph for LangGraph Studio / `langgraph dev` (see langgraph.json).

One compiled graph with every refine strategy of the registry mounted as a subgraph: a run
picks its strategy, like its gate, in the context. On the servers `connect` finds without
contacting them (env MUR_BASE_URL / MUR_MODEL / MUR_VERIFIER_URL / MUR_VERIFIER_MODEL, else the
embedded CPU server's address: start it with `mur servers up`), so the graph compiles at import
with no server running. No checkpointer is compiled in: the LangGraph API server brings its own.
"""

from mur.graphs.mur import build_graph
from mur.servers.connect import connect

_servers = connect(probe=False)
mur = build_graph(backbone=_servers.backbone, verifier=_servers.verifier)
