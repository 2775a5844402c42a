"""The MUR graph: State, Context, the assembly of the loop and its refine strategies."""

from graphs.mur import build_graph
from graphs.refine import STRATEGIES
from graphs.state import Context, ContextError, OutputState, State, output_of

__all__ = [
    "STRATEGIES",
    "Context",
    "ContextError",
    "OutputState",
    "State",
    "build_graph",
    "output_of",
]
