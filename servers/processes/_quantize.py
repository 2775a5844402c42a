"""Child-process half of `servers.processes.model` for quantized formats: a converted bf16
Hugging Face folder -> a compressed-tensors folder vLLM serves (W8A8 int8, W4A16 int4).

Run as a script (`python _quantize.py SCHEME SRC_DIR DEST_DIR`), like `_convert.py`, so torch
is imported in a short-lived process. Round-to-nearest, no calibration data: what llmcompressor's
QuantizationModifier does for these schemes (weight scales from each channel's or group's
absolute maximum, symmetric; W8A8's activations are quantized per token at run time, so they
need no scale). The schemes are compressed-tensors' presets and the folder is written by its
ModelCompressor, the library vLLM reads them with; lm_head stays in the model's dtype.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import (
    QuantizationConfig,
    QuantizationStatus,
    QuantizationStrategy,
    apply_quantization_config,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import calculate_qparams
from transformers import AutoModelForCausalLM, AutoTokenizer

KEPT = ["lm_head"]
"""Layers left unquantized (as llmcompressor's examples do: the logits stay exact)."""


def _weight_range(weight: torch.Tensor, strategy: QuantizationStrategy, group: int | None):
    """Per-channel (`[out, 1]`) or per-group (`[out, in / group]`) min and max of a weight."""
    if strategy == QuantizationStrategy.CHANNEL:
        return weight.amin(dim=-1, keepdim=True), weight.amax(dim=-1, keepdim=True)
    if strategy == QuantizationStrategy.GROUP and group:
        rows, cols = weight.shape
        if cols % group:
            raise SystemExit(f"a weight of {cols} columns does not split into groups of {group}")
        grouped = weight.reshape(rows, cols // group, group)
        return grouped.amin(dim=-1), grouped.amax(dim=-1)
    raise SystemExit(f"round-to-nearest here supports channel and group weights, not {strategy}")


def quantize(scheme_name: str, source: Path, dest: Path) -> None:
    """Quantize the model in `source` with compressed-tensors' preset `scheme_name` into
    `dest` (which must exist), tokenizer beside it."""
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
    scheme = preset_name_to_scheme(scheme_name, ["Linear"])
    config = QuantizationConfig(
        config_groups={"group_0": scheme},
        ignore=KEPT,
        quantization_status=QuantizationStatus.INITIALIZED,
    )
    apply_quantization_config(model, config)
    args = scheme.weights
    assert args is not None  # every preset quantizes weights
    quantized = 0
    with torch.no_grad():
        for module in model.modules():
            if getattr(module, "quantization_scheme", None) is None:
                continue
            assert isinstance(module, torch.nn.Linear)  # the scheme targets Linear layers only
            low, high = _weight_range(module.weight.float(), args.strategy, args.group_size)
            scale, zero_point = calculate_qparams(low, high, args)
            weight_scale = module.get_parameter("weight_scale")
            weight_scale.copy_(scale.to(weight_scale.dtype))
            if hasattr(module, "weight_zero_point"):
                module.get_parameter("weight_zero_point").copy_(zero_point)
            quantized += 1
    if not quantized:
        raise SystemExit(f"no Linear layer of {source} matched scheme {scheme_name}")
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(dest)
    compressor.update_config(str(dest))
    AutoTokenizer.from_pretrained(source).save_pretrained(dest)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: python _quantize.py W8A8|W4A16 SRC_DIR DEST_DIR")
    quantize(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
