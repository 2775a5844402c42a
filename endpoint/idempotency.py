"""Idempotency keys: which run a request names, and whose it is.

A request names its run with the `Idempotency-Key` header (the IETF draft's, as payment APIs
use it) or `"idempotency_key"` in its `mur` field. The run's thread id is a digest of the
caller (a digest of the API key it authenticated with, or "open" on an endpoint without keys)
and the key, so a key is scoped to its caller: another API key sending the same key names
another run, and can neither read nor resume this one. The fingerprint (model, messages,
settings, seed, as the endpoint reads them) tells a retry from a different request reusing
the key.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

from starlette.datastructures import Headers

from mur.endpoint.errors import bad_request
from mur.endpoint.schemas import ChatCompletionRequest, Job

HEADER = "Idempotency-Key"
FIELD = "idempotency_key"
MAX_KEY_CHARS = 255
OPEN_CALLER = "open"
"""The caller of every request on an endpoint without API keys."""
CALLER_STATE = "mur_caller"
"""The request-scope state entry where the API key guard leaves the caller's id."""
_KEY = re.compile(rf"[\x20-\x7e]{{1,{MAX_KEY_CHARS}}}")


def caller_of(scope: Mapping[str, Any]) -> str:
    """The caller's id the API key guard set on the ASGI scope ("open" without keys)."""
    return str((scope.get("state") or {}).get(CALLER_STATE, OPEN_CALLER))


def _checked(key: Any, where: str) -> str:
    if not isinstance(key, str) or not _KEY.fullmatch(key) or not key.strip():
        raise bad_request(
            f"{where} must be 1 to {MAX_KEY_CHARS} printable ASCII characters (e.g. a UUID), "
            f"got {json.dumps(key)[:80]}",
            where,
            code="invalid_idempotency_key",
        )
    return key


def split_key(
    body: ChatCompletionRequest, headers: Headers
) -> tuple[ChatCompletionRequest, str | None]:
    """The body without `mur.idempotency_key` (it is no graph setting), and the request's key
    (None: a run of its own). The header and the field must agree when both are given; the
    header may be given once."""
    given = headers.getlist(HEADER)
    if len(given) > 1:
        raise bad_request(
            f"the {HEADER} header was sent {len(given)} times: send it once",
            HEADER,
            code="invalid_idempotency_key",
        )
    key = _checked(given[0], HEADER) if given else None
    if not (isinstance(body.mur, Mapping) and FIELD in body.mur):
        return body, key
    field = _checked(body.mur[FIELD], f"mur.{FIELD}")
    if key is not None and field != key:
        raise bad_request(
            f"the {HEADER} header {key!r} and mur.{FIELD} {field!r} differ: send one key",
            f"mur.{FIELD}",
            code="invalid_idempotency_key",
        )
    settings = {name: value for name, value in body.mur.items() if name != FIELD}
    return body.model_copy(update={"mur": settings or None}), field


def fingerprint(job: Job) -> str:
    """A digest of what the run computes, as the endpoint reads the request: strategy, gate,
    question, system prompt and every graph setting with its default filled in (the seed among
    them). A retry that means the same is the same (`"mur": {}` and no `mur`, content as text
    parts or as a string); `stream` and OpenAI's ignored sampling fields are not in it (a
    retry may stream where the first did not)."""
    what = {
        "strategy": job.strategy,
        "gate": job.gate,
        "question": job.question,
        "system_prompt": job.system_prompt,
        "context": job.context.as_dict(),
    }
    canonical = json.dumps(what, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def thread_id_of(caller: str, key: str | None) -> str:
    """The run's thread id: derived from (caller, key), or fresh for a request without a key
    (which is never checkpointed: its id only names the run and its model calls' session)."""
    if key is None:
        return f"once-{uuid.uuid4().hex}"
    digest = hashlib.sha256(f"{caller}\x00{key}".encode()).hexdigest()
    return f"key-{digest[:40]}"
