"""The claim fence on a run's checkpoints: the endpoint graph's saver writes a checkpoint only
while the claim in the run's config holds the run in the ledger (persistence/ledger.py).

The endpoint's durable runs (endpoint/durable.py) put their claim into each run's config;
this saver is the one place their checkpoints are written.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from mur.persistence.ledger import Claim, RunLedger

CLAIM_KEY = "mur_claim"
"""Where a run's graph config (`configurable`) carries its Claim, for FencedSaver; also the
key of each checkpoint's metadata naming the claim that wrote it (its number)."""


class FencedSaver(BaseCheckpointSaver[Any]):
    """The endpoint graph's checkpointer: the store's saver, each write of a run fenced by the
    claim in the run's config (CLAIM_KEY; a config without one is written as it is), and each
    checkpoint's metadata naming that claim's number.

    A checkpoint, its blobs and a task's writes are written inside the ledger's `fenced`
    transaction: they land only if the claim holds the run when they commit, and the claim
    cannot move until they have (the takeover's UPDATE waits for the row lock). A write after
    a takeover or a prune is refused (ClaimLost) and the run stops there, before its next
    node's model call; a write made while the claim held is never removed, so the next holder
    resumes from every checkpoint its predecessor wrote. Neither can a pruned run be written
    again: its row is marked `pruning` before its checkpoints go, and a write needs the row
    `running`, so no checkpoint outlives its ledger row.
    """

    def __init__(self, inner: BaseCheckpointSaver[Any], ledger: RunLedger) -> None:
        super().__init__(serde=inner.serde)
        self.inner, self.ledger = inner, ledger

    @property
    def config_specs(self) -> list[Any]:
        return self.inner.config_specs

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        claim = claim_of(config)
        if claim is None:
            return await self.inner.aput(config, checkpoint, metadata, new_versions)
        tagged = cast(CheckpointMetadata, {**metadata, CLAIM_KEY: claim.number})
        async with self.ledger.fenced(claim):
            return await self.inner.aput(config, checkpoint, tagged, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        claim = claim_of(config)
        if claim is None:
            return await self.inner.aput_writes(config, writes, task_id, task_path)
        async with self.ledger.fenced(claim):
            await self.inner.aput_writes(config, writes, task_id, task_path)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self.inner.aget_tuple(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        async for found in self.inner.alist(config, filter=filter, before=before, limit=limit):
            yield found

    async def adelete_thread(self, thread_id: str) -> None:
        await self.inner.adelete_thread(thread_id)

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.inner.get_next_version(current, channel)

    def with_allowlist(self, extra_allowlist: Any) -> FencedSaver:
        """The inner saver's clone with LangGraph's msgpack allowlist, fenced alike (the
        inner saver does the serialising)."""
        inner = self.inner.with_allowlist(extra_allowlist)
        return self if inner is self.inner else FencedSaver(inner, self.ledger)


def claim_of(config: RunnableConfig) -> Claim | None:
    """The claim a run's (or its subgraphs') config carries, if any."""
    claim = (config.get("configurable") or {}).get(CLAIM_KEY)
    return claim if isinstance(claim, Claim) else None
