"""The package's test doubles, shipped with it as langchain-core ships its fake chat models:
a scripted chat model (scripted_chat) whose every reply and token logprob is known in advance,
the MUR endpoint over it (fake_endpoint) and a vLLM-shaped server that answers at once
(fake_vllm). The unit tests and the load and chaos suites (benchmarks/) share them, and an app
that embeds MUR can test its own code against them; they are shipped so that `mur bench` runs
from an installed wheel. Nothing in the package imports them (pyproject.toml's contracts)."""
