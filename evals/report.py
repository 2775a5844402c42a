"""Paper-style tables (and a gamma-sweep plot) recomputed from records.jsonl.

    python -m evals.report DIR

Rows: one per (dataset, strategy, gate, gamma), then the average over datasets. Columns as in
the paper's Table 1: accuracy, backbone / external / total tokens per question, total tokens
against the `always` gate (Per-Step Scale) of the same dataset and strategy, steps total and
scaled per question, latency p50/p95/p99.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evals.records import load_records

AVERAGE = "average"


@dataclass(frozen=True)
class Row:
    dataset: str
    strategy: str
    gate: str
    gamma: float | None
    runs: int
    accuracy: float
    backbone_tokens: float
    external_tokens: float
    total_tokens: float
    tokens_vs_always: float | None
    steps_total: float
    steps_scaled: float
    latency_p50: float
    latency_p95: float
    latency_p99: float


@dataclass(frozen=True)
class Report:
    rows: list[Row]
    markdown: str
    markdown_path: Path
    json_path: Path
    plot_path: Path | None


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def summarize(records: Sequence[dict[str, Any]]) -> list[Row]:
    """One row per (dataset, strategy, gate, gamma) plus dataset averages."""
    groups: dict[tuple[str, str, str, float | None], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        groups[(record["dataset"], record["strategy"], record["gate"], record["gamma"])].append(
            record
        )
    rows: list[Row] = []
    for (dataset, strategy, gate, gamma), group in sorted(groups.items(), key=_group_order):
        usage = [r["usage"] for r in group]
        latency = [r["latency_s"] for r in group]
        backbone = _mean([u["backbone_tokens"] for u in usage])
        external = _mean([u["external_tokens"] for u in usage])
        rows.append(
            Row(
                dataset=dataset,
                strategy=strategy,
                gate=gate,
                gamma=gamma,
                runs=len(group),
                accuracy=100.0 * _mean([1.0 if r["correct"] else 0.0 for r in group]),
                backbone_tokens=backbone,
                external_tokens=external,
                total_tokens=backbone + external,
                tokens_vs_always=None,
                steps_total=_mean([r["steps_total"] for r in group]),
                steps_scaled=_mean([r["steps_scaled"] for r in group]),
                latency_p50=_percentile(latency, 50),
                latency_p95=_percentile(latency, 95),
                latency_p99=_percentile(latency, 99),
            )
        )
    rows = _with_ratio_to_always(rows)
    datasets = {row.dataset for row in rows}
    if len(datasets) > 1:
        rows += _with_ratio_to_always(_averages(rows))
    return rows


def _group_order(item: tuple[tuple[str, str, str, float | None], Any]) -> tuple:
    dataset, strategy, gate, gamma = item[0]
    return (dataset, strategy, gate, -1.0 if gamma is None else gamma)


def _averages(rows: Sequence[Row]) -> list[Row]:
    """The unweighted mean over datasets of each (strategy, gate, gamma), like the paper's Avg."""
    by_setting: dict[tuple[str, str, float | None], list[Row]] = defaultdict(list)
    for row in rows:
        by_setting[(row.strategy, row.gate, row.gamma)].append(row)
    averaged = []
    numeric = [
        f
        for f in Row.__dataclass_fields__
        if f not in ("dataset", "strategy", "gate", "gamma", "runs", "tokens_vs_always")
    ]
    for (strategy, gate, gamma), group in by_setting.items():
        values = {f: _mean([getattr(r, f) for r in group]) for f in numeric}
        averaged.append(
            Row(
                dataset=AVERAGE,
                strategy=strategy,
                gate=gate,
                gamma=gamma,
                runs=sum(r.runs for r in group),
                tokens_vs_always=None,
                **values,
            )
        )
    return averaged


def _with_ratio_to_always(rows: Sequence[Row]) -> list[Row]:
    always = {(r.dataset, r.strategy): r.total_tokens for r in rows if r.gate == "always"}
    out = []
    for row in rows:
        reference = always.get((row.dataset, row.strategy))
        ratio = row.total_tokens / reference if reference else None
        out.append(Row(**{**asdict(row), "tokens_vs_always": ratio}))
    return out


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def to_markdown(rows: Sequence[Row]) -> str:
    header = (
        "| dataset | strategy | gate | gamma | runs | acc % | backbone tok | external tok | "
        "total tok | vs always | steps | scaled | p50 s | p95 s | p99 s |"
    )
    lines = [header, "|" + "---|" * 15]
    for r in rows:
        lines.append(
            f"| {r.dataset} | {r.strategy} | {r.gate} | "
            f"{'-' if r.gamma is None else f'{r.gamma:g}'} | {r.runs} | {_fmt(r.accuracy)} | "
            f"{_fmt(r.backbone_tokens, 0)} | {_fmt(r.external_tokens, 0)} | "
            f"{_fmt(r.total_tokens, 0)} | "
            f"{'-' if r.tokens_vs_always is None else f'{r.tokens_vs_always:.2f}x'} | "
            f"{_fmt(r.steps_total, 2)} | {_fmt(r.steps_scaled, 2)} | "
            f"{_fmt(r.latency_p50, 2)} | {_fmt(r.latency_p95, 2)} | {_fmt(r.latency_p99, 2)} |"
        )
    return "\n".join(lines) + "\n"


def plot_gamma_sweep(rows: Sequence[Row], path: Path) -> Path | None:
    """Accuracy and total tokens against gamma for the mur gate (the paper's Figure 3)."""
    sweep = [r for r in rows if r.gate == "mur" and r.gamma is not None]
    if len({r.gamma for r in sweep}) < 2:
        return None
    # Local: matplotlib is slow to import, only a gamma sweep plots, and the backend must be
    # chosen before pyplot is imported.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, tok_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for dataset, strategy in sorted({(r.dataset, r.strategy) for r in sweep}):
        series = sorted(
            (r for r in sweep if (r.dataset, r.strategy) == (dataset, strategy)),
            key=lambda r: r.gamma,
        )
        gammas = [r.gamma for r in series]
        label = f"{dataset} / {strategy}"
        acc_ax.plot(gammas, [r.accuracy for r in series], marker="o", label=label)
        tok_ax.plot(gammas, [r.total_tokens for r in series], marker="o", label=label)
    acc_ax.set(xlabel="gamma", ylabel="accuracy (%)", title="Accuracy vs gamma")
    tok_ax.set(xlabel="gamma", ylabel="tokens per question", title="Tokens vs gamma")
    acc_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(folder: str | Path) -> Report:
    folder = Path(folder)
    rows = summarize(load_records(folder))
    markdown = to_markdown(rows)
    markdown_path = folder / "report.md"
    json_path = folder / "report.json"
    markdown_path.write_text(markdown)
    json_path.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    plot_path = plot_gamma_sweep(rows, folder / "gamma_sweep.png")
    return Report(rows, markdown, markdown_path, json_path, plot_path)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m evals.report RUN_DIR", file=sys.stderr)
        return 2
    try:
        report = write_report(args[0])
    except FileNotFoundError as exc:
        print(f"evals.report: {exc}", file=sys.stderr)
        return 2
    print(report.markdown)
    print(
        f"written: {report.markdown_path}, {report.json_path}"
        + (f", {report.plot_path}" if report.plot_path else ""),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
