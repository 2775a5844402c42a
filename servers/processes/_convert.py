"""Child-process half of `servers.processes.model`: GGUF -> Hugging Face folder (bf16
safetensors).

Run as a script (`python _convert.py SRC.gguf DEST_DIR`) so torch/transformers are imported in a
short-lived process (memory freed afterwards) rather than in whatever program asked for the
model. `servers.processes.model` starts it with HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1 in
its environment: the hub reads them when it is imported, so they cannot be set from here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig


def convert(gguf: Path, dest: Path) -> None:
    """Dequantize `gguf` and save model + tokenizer into `dest` (which must exist)."""
    folder, name = str(gguf.parent), gguf.name
    # dequantize=True: save_pretrained refuses a model still holding GGUF blocks.
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=name, dequantize=True),
    )
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if not getattr(tokenizer, "chat_template", None):
        raise SystemExit(f"{gguf} carries no chat template; it cannot serve chat completions")
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(
            "usage: HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 python _convert.py SRC.gguf DEST_DIR"
        )
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
