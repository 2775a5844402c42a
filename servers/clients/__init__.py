"""What talks to a model server: LangChain chat models bound to it (chat_models), the clients
the environment names (environment), the session header that keeps a question on one replica
(sessions), URL forms and probes (probes), the server's token counters (metrics), what a failed
request means (transport_errors) and the serving layer's errors (errors).

The method (graphs/) reaches servers only through this side; it never imports what runs a
server (servers.processes), which imports this side and not the other way round (the import
contracts in pyproject.toml). Nothing is imported here: a module that needs one of these names
imports its module.
"""
