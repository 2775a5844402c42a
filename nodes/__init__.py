"""One concern per module: requests to a chat model (llm) and what they cost (usage), uncertainty
math, gates, drafting, judging, selection, thinking.

Nodes never import graphs/, evals/ or servers/: models arrive injected, and what a client's
exception means is the graph's to judge (servers.clients.transport_errors).
"""
