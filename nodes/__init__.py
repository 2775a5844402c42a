"""One concern per module: uncertainty math, gates, drafting, judging, selection, thinking.

Nodes never import graphs/, evals/ or servers/: models arrive injected.
"""
