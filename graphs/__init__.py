"""The MUR graph: State, Context and the assembly of nodes and refine subgraphs."""

from graphs.mur import build_graph
from graphs.state import STRATEGIES, Context, OutputState, State, output_of

__all__ = ["STRATEGIES", "Context", "OutputState", "State", "build_graph", "output_of"]
