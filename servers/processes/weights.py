"""Weight formats a CPU profile can serve a model package in: one registry entry each.

`bf16` is the package's GGUF dequantized to a Hugging Face folder (`_convert.py`); the others
are made from that folder by `_quantize.py` with a compressed-tensors preset, and vLLM serves
them through compressed-tensors' kernels (oneDNN int8 GEMMs for W8A8 on CPUs). Formats give
different tokens: a results folder records the format it was served in (`facts.py`) and
refuses to mix two. Which one a CPU profile serves by default is `cpu_weights()`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from mur.servers.clients.errors import ServerError

WEIGHTS_ENV = "MUR_CPU_WEIGHTS"
BF16 = "bf16"


@dataclass(frozen=True)
class WeightFormat:
    """One way to store a model's weights, and how `mur servers model` makes it."""

    name: str
    scheme: str | None
    """compressed-tensors' preset that makes it from the bf16 folder; None for bf16 itself."""
    description: str


WEIGHT_FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        WeightFormat(
            BF16,
            None,
            "the package's GGUF dequantized to bfloat16 (served in the profile's dtype)",
        ),
        WeightFormat(
            "w8a8",
            "W8A8",
            "int8 weights per channel, int8 activations per token (dynamic); round-to-nearest "
            "from the bf16 folder, lm_head kept",
        ),
        WeightFormat(
            "w4a16",
            "W4A16",
            "int4 weights in groups of 128, activations in the profile's dtype; round-to-nearest "
            "from the bf16 folder, lm_head kept",
        ),
    )
}


def get_weight_format(name: str) -> WeightFormat:
    """The format called `name`, or a ServerError naming the valid ones."""
    try:
        return WEIGHT_FORMATS[name]
    except KeyError:
        raise ServerError(
            f"unknown weight format {name!r}: choose one of {', '.join(WEIGHT_FORMATS)}"
        ) from None


def cpu_weights() -> str:
    """The format CPU profiles serve: `$MUR_CPU_WEIGHTS` if set, else bf16.

    bf16 on every CPU: W8A8 is faster where the CPU has VNNI, but it was not shown to answer
    as well (servers/README.md, "weight formats", says by how much). A CPU check choosing a
    faster format would go here.
    """
    override = os.environ.get(WEIGHTS_ENV, "").strip()
    if not override:
        return BF16
    if override not in WEIGHT_FORMATS:
        raise ServerError(
            f"{WEIGHTS_ENV}={override!r} is not a weight format: use one of "
            f"{', '.join(WEIGHT_FORMATS)} (or unset it for {BF16})"
        )
    return override
