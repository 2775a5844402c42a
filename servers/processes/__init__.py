"""What runs a model server on this machine: the launcher (start, reuse), what is running and
how to stop it (running: status, down), the pid records of what it started (pids), replicas
behind a router (replicas), workers behind a router supervised in the foreground
(supervisor, orphans), the server profiles (profiles), the embedded model and the PyPI
packages that carry it (model, packages, _convert), MUR_HOME's folders (paths), what a running
server is (facts) and how fast it streams (throughput).

It uses the clients side (servers.clients) to probe what it starts and to name request
timeouts; the clients side never imports it, and neither do graphs/ and nodes/ (the import
contracts in pyproject.toml). Nothing is imported here: a module that needs one of these names
imports its module.
"""
