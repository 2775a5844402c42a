"""Which servers made a folder's runs, and how many questions they were given at once.

settings.json keeps, under "servers", one entry per server set the folder was filled on: each
role's facts (`servers.processes.facts`: vLLM version, dtype, logprobs mode, CPU) and the
questions in flight with the throughput measurement that chose them. A resume on a server whose
tokens would differ (another dtype, vLLM version or logprobs mode) stops with one line naming
both; `--allow-mixed-servers` resumes anyway and the new entry says `"mixed": true`, so a table
is never silently the work of two kinds of server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from langchain_core.language_models import BaseChatModel

from mur.evals.harness.records import SETTINGS, RecordStore, SettingsMismatchError
from mur.servers.processes.facts import (
    ServerFacts,
    describe_recorded,
    server_facts,
    token_differences,
)
from mur.servers.processes.throughput import STREAMS, StreamRate, choose, measured_rates

SERVERS = "servers"
FALLBACK_CONCURRENCY = 8
"""Questions in flight where no vLLM server can be measured (a fake in a test, another API)."""
ROLES = ("backbone", "verifier")


class ServerMixError(SettingsMismatchError):
    """A folder's runs were made on a server whose tokens differ from this one's."""


def endpoint(model: BaseChatModel) -> tuple[str, str] | None:
    """(base URL, served model) of an OpenAI-compatible chat model; None for a fake."""
    url = getattr(model, "openai_api_base", None)
    name = getattr(model, "model_name", None)
    return (str(url), str(name)) if url and name else None


def role_facts(backbone: BaseChatModel, verifier: BaseChatModel) -> dict[str, ServerFacts]:
    """Each role's server facts (roles served by no HTTP server are left out)."""
    models = zip(ROLES, (backbone, verifier), strict=True)
    return {role: server_facts(*where) for role, model in models if (where := endpoint(model))}


def same_host(url: str, urls: list[str]) -> list[str]:
    """The other servers of `urls` on `url`'s host: they share its cores."""
    host = urlsplit(url).hostname
    return [other for other in urls if other != url and urlsplit(other).hostname == host]


def choose_concurrency(
    facts: dict[str, ServerFacts],
    streams: tuple[int, ...] = STREAMS,
    asked: tuple[str, ...] = ROLES,
) -> tuple[int, dict[str, list[StreamRate]]]:
    """Questions in flight: the fewest streams near each asked server's best throughput, the
    smaller of the two where backbone and verifier are different servers. A role the strategy
    does not ask (`asked`: the verifier of foresight or thinking) is not measured, but other
    work on its server still keeps a measurement out of the cache (it shares the cores)."""
    if not facts or any(f.vllm_version is None for f in facts.values()):
        return FALLBACK_CONCURRENCY, {}  # a test double or another API: nothing to measure
    distinct: dict[str, str] = {}
    for role, fact in facts.items():
        distinct.setdefault(fact.base_url, role)  # one server in both roles: "backbone"
    rates = {
        role: measured_rates(facts[role], streams, beside=same_host(url, list(distinct)))
        for url, role in distinct.items()
        if role in asked
    }
    if not rates:
        return FALLBACK_CONCURRENCY, {}  # the asked roles are test doubles
    return min(choose(r) for r in rates.values()), rates


def servers_entry(
    facts: dict[str, ServerFacts],
    concurrency: int,
    rates: dict[str, list[StreamRate]],
    how: str,
) -> dict[str, Any]:
    return {
        **{role: f.as_json() for role, f in facts.items()},
        "concurrency": concurrency,
        "concurrency_chosen_by": how,
        "throughput_tok_s": {
            role: {str(r.streams): r.tokens_per_s for r in measured}
            for role, measured in rates.items()
        },
    }


def record_servers(store: RecordStore, entry: dict[str, Any], *, allow_mixed: bool) -> None:
    """Check `entry` against the servers the folder's runs were made on, then record it
    (a new entry only when something changed; it says from which run on it holds)."""
    path = store.folder / SETTINGS
    with store.lock:
        data = json.loads(path.read_text()) if path.exists() else {}
        history: list[dict[str, Any]] = data.get(SERVERS, [])
        last = history[-1] if history else None
        mixed = []
        for role in ROLES:
            if last is None or role not in last or role not in entry:
                continue
            for fact in token_differences(last[role], entry[role]):
                mixed.append((role, fact, last[role][fact], entry[role][fact]))
        if mixed and not allow_mixed:
            role, fact, was, now = mixed[0]
            raise ServerMixError(
                f"{path}: the runs in {store.folder} were made on a {role} server with "
                f"{fact}={was!r}, and the {role} now has {fact}={now!r} (tokens differ): resume "
                "on a server like the recorded one, or pass --allow-mixed-servers to go on and "
                "record the mix"
            )
        if last is not None and all(last.get(k) == entry.get(k) for k in (*ROLES, "concurrency")):
            return  # the same servers as the last entry
        runs = len(store.done_keys())
        history.append({**entry, "from_run": runs, "mixed": bool(mixed)})
        path.write_text(json.dumps({**data, SERVERS: history}, indent=2, sort_keys=True) + "\n")


def served_by(folder: str | Path) -> list[str]:
    """What served a folder's runs, one line per server set settings.json records (with the
    run it held from, and a mix said as such): for every report to name its servers."""
    path = Path(folder) / SETTINGS
    if not path.exists():
        return []
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return [f"unknown: {path} is unreadable ({exc})"]
    if not isinstance(recorded, dict):
        return [f"unknown: {path} is not the settings object a run writes"]
    history = recorded.get(SERVERS, [])
    lines = []
    for entry in history:
        phrases = {role: describe_recorded(entry[role]) for role in ROLES if role in entry}
        if len(set(phrases.values())) == 1:
            served = f"{next(iter(phrases.values()))} ({' and '.join(phrases)})"
        else:
            served = "; ".join(f"{role}: {phrase}" for role, phrase in phrases.items())
        mixed = (
            ", a MIX of token-changing facts (--allow-mixed-servers)" if entry.get("mixed") else ""
        )
        lines.append(f"from run {entry.get('from_run', 0)}: {served}{mixed}")
    return lines
