"""MUR behind an OpenAI-compatible HTTP API (FastAPI), so any OpenAI client can call the
reasoning loop: `mur endpoint`, or `create_app(backbone, verifier)` over any LangChain
chat models (tests inject the scripted fake).

One module per job: app (routes), schemas (the request and its validation through
graphs.Context), replies (OpenAI's reply types), streaming (SSE), runs (starting and cancelling
graph runs, the run limit), guards (API key, body size), errors (OpenAI's error shape); its
flags and uvicorn are the command's (cli/endpoint.py). Runs that survive their replica:
idempotency (which run a request names, scoped to its caller), ledger (the run table beside the
checkpoints), durable (claims, leases, recorded replies, pruning), refusals (409/422/429/503),
checkpointing (where runs are checkpointed, and the check at start). Beside them, studio: the graph
LangGraph's own API server serves (`langgraph dev`, LangGraph Studio; named in langgraph.json).
The endpoint drives graphs/ like any other user and takes its models from the serving layer's
client factory; nothing else in the project imports it.
"""

from mur.endpoint.app import create_app
from mur.endpoint.schemas import MODELS, model_name

__all__ = ["MODELS", "create_app", "model_name"]
