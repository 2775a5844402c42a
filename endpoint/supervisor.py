"""Endpoint replicas and the vllm-router in front of them, as child processes of one foreground
process: started in order, watched, restarted when one dies (servers/processes/supervisor.py,
which also ties them to this process so they die with it), drained on a signal.

What is the endpoint's own is how its replicas stop: each drains its runs on one SIGTERM
(endpoint/drain.py), so it gets exactly one (a second would cut its drain short), and exits at
once on a second. A replica that died is started again on its port; its runs are taken over by
the others once their leases expire. The replicas get the environment they are given (`env`:
the checkpointer URL and the API keys among it); the router only what vllm-router needs.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from mur.servers.clients.probes import healthy
from mur.servers.processes.supervisor import POLL_S, Child, WorkerSupervisor

__all__ = ["RESIGNAL_S", "Child", "Supervisor"]

RESIGNAL_S = 1.0
"""How often forced replicas get SIGTERM again: signals sent close together may arrive as one
(the kernel and Python each keep one pending signal of a kind), and a replica exits at once
only on its second."""


class Supervisor(WorkerSupervisor):
    """Endpoint replicas behind a router: `start`, then `check` periodically until told to
    stop, then `drain`; `close` kills whatever is left (on any error path). `env` is the
    replicas' environment, `router_env` the router's (default: what vllm-router needs of this
    process's environment, servers.processes.replicas.router_env)."""

    def drain(self, grace: float, signals: Callable[[], int]) -> int:
        """SIGTERM to every replica (each drains its runs), a second SIGTERM when a second
        signal arrives (`signals()` counts them), SIGKILL after `grace`; then the router goes.
        0 when every replica that was serving exited 0 of its own accord: one dead and waiting
        for its restart, or started again and not yet answering, has no run to drain."""
        self.stopping = True
        serving = [c for c in self.replicas if c.alive() and (c.ready or healthy(c.root))]
        self.say(f"stopping: the replicas drain (at most {grace:.0f} s), then the router stops")
        self.signal_replicas(signal.SIGTERM)
        deadline = time.monotonic() + grace
        forced, killed, resignal_at = False, False, 0.0
        while any(child.alive() for child in self.replicas):
            now = time.monotonic()
            if signals() > 1 and not forced:
                self.say("second signal: the replicas exit now")
                forced = True
            if forced and not killed and now >= resignal_at:
                self.signal_replicas(signal.SIGTERM)
                resignal_at = now + RESIGNAL_S
            if now > deadline and not killed:
                self.say("the replicas did not exit in time: killing them")
                self.signal_replicas(signal.SIGKILL)
                forced = killed = True
            time.sleep(POLL_S)
        self.stop_router()
        codes = [child.process.returncode for child in serving if child.process]
        return 0 if not forced and all(code == 0 for code in codes) else 1
