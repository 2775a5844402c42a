"""What a person sees of a solve: each kept step as it arrives, then the answer and the usage
(`--json` prints the output contract instead, and this prints nothing)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from mur.graphs.refine import summarise
from mur.graphs.traces import trace_label, traces_line


class Printer:
    """Human output: each kept step as it arrives, then the answer and the usage."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.console = Console(stderr=False, highlight=False)
        self.several = False
        """Several traces: each step is labelled with its trace (and a branch's parent)."""

    def say(self, text: str) -> None:
        """A progress line (the question, the server, a resumed thread), dimmed."""
        if self.enabled:
            self.console.print(f"[dim]{text}[/dim]")

    def step(self, event: dict[str, Any]) -> None:
        """One kept step: its numbers, whether the gate scaled it, its text."""
        if not self.enabled:
            return
        threshold = event["threshold"]
        numbers = f"m={event['draft_uncertainty']:.3f}  M={event['momentum_before']:.3f}"
        if threshold is not None:
            numbers += f"  thr={threshold:.3f}"
        summary = summarise(event["refine"])
        mark = (
            f"[bold yellow]SCALED ({event['strategy']}{f': {summary}' if summary else ''})"
            "[/bold yellow]"
            if event["scaled"]
            else "[green]kept[/green]"
        )
        label = ""
        if self.several:
            trace = trace_label(event["trace"], event.get("parent"), event.get("branch_step"))
            label = f"[cyan]{trace}[/cyan]  "
        self.console.print(f"{label}[bold]Step{event['index']}[/bold]  {numbers}  {mark}")
        if event["scaled"]:
            self.console.print(f"   [dim]kept m={event['uncertainty']:.3f}[/dim]")
        self.console.print(f"   {event['text']}", markup=False)

    def result(self, result: dict[str, Any]) -> None:
        """The answer, how the solve ended, and the tokens it cost."""
        if not self.enabled:
            return
        usage = result["usage"]
        scaled = sum(step["scaled"] for step in result["steps"])
        if result.get("fallback"):
            self.console.print(Text.assemble(("fallback: ", "dim"), result["fallback"]["text"]))
        if line := traces_line(result.get("traces") or []):
            self.console.print(Text.assemble(("\nTraces: ", "bold"), line))
        self.console.print(
            f"\n[bold]Answer:[/bold] {result['answer']}   "
            f"[dim](finish: {result['finish_reason']}, {len(result['steps'])} steps, "
            f"{scaled} scaled)[/dim]"
        )
        self.console.print(
            f"Tokens: backbone {usage['backbone_tokens']}, external {usage['external_tokens']}, "
            f"prompt {usage['backbone_prompt_tokens'] + usage['external_prompt_tokens']}, "
            f"LLM calls {usage['llm_calls']}"
        )
