"""Where runs are kept: the checkpointers (SQLite in the base install, PostgreSQL with the
`serve` extra) and SQL over their databases in one dialect (databases.py), the endpoint's run
ledger (ledger.py: who runs what, leases, finished replies) and the claim fence on a run's
checkpoints (fence.py).

No graph needs this room: a graph is compiled with whatever saver its caller opens here
(`mur solve --checkpoint`, the endpoint, an evaluation's folder).
"""
