"""The MUR graph: State, Context, the assembly of the loop and its refine strategies."""

from mur.graphs.mur import build_graph
from mur.graphs.refine import STRATEGIES
from mur.graphs.state import Context, ContextError, OutputState, State, output_of

__all__ = [
    "STRATEGIES",
    "Context",
    "ContextError",
    "OutputState",
    "State",
    "build_graph",
    "output_of",
]
