"""The report's figures: accuracy against tokens (the paper's trade-off) and the gamma sweep.

Built on matplotlib's object API (``Figure``), so no global pyplot state or GUI backend is
touched. Accuracy axes stay within [0, 100] % and are never degenerate: a table where every
setting scores 0% still gets a readable 0-5% axis, never a negative one.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from numpy.typing import ArrayLike

from mur.evals.report.rows import Row, sections

_MIN_SPAN = 5.0  # percentage points: the smallest accuracy range an axis shows


def accuracy_limits(lows: Sequence[float], highs: Sequence[float]) -> tuple[float, float]:
    """A y range in percent holding every interval, padded, clipped to [0, 100], never empty."""
    low, high = min(lows, default=0.0), max(highs, default=0.0)
    pad = max(_MIN_SPAN, 0.1 * (high - low))
    bottom, top = max(0.0, low - pad), min(100.0, high + pad)
    if top - bottom < _MIN_SPAN:  # pinned at 0 or 100
        bottom, top = (0.0, _MIN_SPAN) if bottom == 0.0 else (100.0 - _MIN_SPAN, 100.0)
    return bottom, top


def token_limits(tokens: Sequence[float]) -> tuple[float, float]:
    """An x range around the token counts (never below 0), padded so labels fit."""
    low, high = min(tokens, default=0.0), max(tokens, default=1.0)
    pad = max(0.08 * (high - low), 0.05 * high, 1.0)
    return max(0.0, low - pad), high + 2 * pad  # room on the right for the gamma labels


def _bounds(row: Row) -> tuple[float, float]:
    """The row's interval in percent (its point when it has none)."""
    low = row.accuracy if row.accuracy_low is None else row.accuracy_low
    high = row.accuracy if row.accuracy_high is None else row.accuracy_high
    return 100 * low, 100 * high


def _accuracy_bars(ax: Axes, xs: ArrayLike, rows: Sequence[Row], **style: Any) -> None:
    """The rows' accuracies in percent at `xs`, their intervals as asymmetric error bars (never
    negative), drawn whole even where they pass the axes' edge."""
    below, above = [], []
    for row in rows:
        low, high = _bounds(row)
        below.append(max(0.0, 100 * row.accuracy - low))
        above.append(max(0.0, high - 100 * row.accuracy))
    accuracy = [100 * row.accuracy for row in rows]
    ax.errorbar(xs, accuracy, yerr=[below, above], capsize=3, clip_on=False, **style)


def _sweeps(rows: Sequence[Row]) -> dict[str, list[Row]]:
    """Gate labels run at two gammas or more, their rows by gamma."""
    by_gate: dict[str, list[tuple[float, Row]]] = defaultdict(list)
    for row in rows:
        if row.gamma is not None:
            by_gate[row.gate].append((row.gamma, row))
    return {
        gate: [row for _, row in sorted(group, key=lambda pair: pair[0])]
        for gate, group in sorted(by_gate.items())
        if len({gamma for gamma, _ in group}) >= 2
    }


def _label_above(row: Row, series: Sequence[Row], default: bool) -> bool:
    """Whether a sweep point's label goes above it: below when a point of the same sweep at
    nearly the same tokens (within 5% of the sweep's token span) lies higher, so the two
    labels do not overlap; `default` otherwise."""
    span = max(r.total_tokens for r in series) - min(r.total_tokens for r in series)
    close = [
        r for r in series if r is not row and abs(r.total_tokens - row.total_tokens) <= 0.05 * span
    ]
    if not close:
        return default
    return all(r.accuracy <= row.accuracy for r in close)


def _fewer(row: Row, most: int) -> str:
    """A setting still running (a resumed table) is marked with its question count."""
    return f"n={row.questions}" if row.questions < most else ""


def accuracy_figure(rows: Sequence[Row]) -> Figure | None:
    """Accuracy (95% CI bars) against total tokens per question, one point per setting, each
    gamma sweep joined as a line; one panel per dataset and strategy. None without rows."""
    panels = dict(sorted(sections(rows).items()))
    if not panels:
        return None
    gates = sorted({r.gate for group in panels.values() for r in group})
    colors = {gate: f"C{i % 10}" for i, gate in enumerate(gates)}
    cols = min(2, len(panels))  # two panels a row, a spare one in the last row hidden
    grid_rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(9.0 * cols, 5.5 * grid_rows), layout="constrained")
    axes = fig.subplots(grid_rows, cols, squeeze=False).ravel().tolist()
    for extra in axes[len(panels) :]:
        extra.set_visible(False)
    for ax, ((dataset, strategy), group) in zip(axes, panels.items(), strict=False):
        sweeps = _sweeps(group)
        most = max(r.questions for r in group)
        for index, (gate, series) in enumerate(sweeps.items()):
            tokens = [r.total_tokens for r in series]
            label = f"{gate} (gamma sweep)"
            _accuracy_bars(ax, tokens, series, fmt="-o", color=colors[gate], label=label)
            for r in series:
                above = _label_above(r, series, default=index % 2 == 0)  # two sweeps: split
                ax.annotate(
                    ", ".join(filter(None, [f"γ={r.gamma:g}", _fewer(r, most)])),
                    (r.total_tokens, 100 * r.accuracy),
                    textcoords="offset points",
                    xytext=(6, 6) if above else (6, -13),
                    fontsize=8,
                    color=colors[gate],
                )
        for r in group:
            if r.gate in sweeps:
                continue
            details = [f"gamma {r.gamma:g}" if r.gamma is not None else "", _fewer(r, most)]
            label = f"{r.gate} ({', '.join(filter(None, details))})" if any(details) else r.gate
            marker = "s" if r.gate in ("always", "never") else "D"
            _accuracy_bars(ax, [r.total_tokens], [r], fmt=marker, color=colors[r.gate], label=label)
        bounds = [_bounds(r) for r in group]
        ax.set_ylim(*accuracy_limits([b[0] for b in bounds], [b[1] for b in bounds]))
        ax.set_xlim(*token_limits([r.total_tokens for r in group]))
        ax.set_title(
            f"{dataset} / {strategy}: accuracy against tokens ({most} questions unless marked)",
            fontsize=11,
        )
        ax.set_xlabel("total tokens per question (backbone + external)")
        ax.set_ylabel("accuracy (%), bars: 95% bootstrap CI")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def gamma_figure(rows: Sequence[Row]) -> Figure | None:
    """Accuracy and tokens against gamma for every gate run at several gammas (the paper's
    Figure 3); None when there is no such sweep."""
    lines = [
        (dataset, strategy, gate, series)
        for (dataset, strategy), group in sorted(sections(rows).items())
        for gate, series in _sweeps(group).items()
    ]
    if not lines:
        return None
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    acc_ax, tok_ax = fig.subplots(1, 2)
    lows, highs = [], []
    for dataset, strategy, gate, series in lines:
        gammas = [r.gamma for r in series if r.gamma is not None]  # all: sweeps have gammas
        label = f"{dataset} / {strategy} / {gate}"
        _accuracy_bars(acc_ax, gammas, series, fmt="-o", label=label)
        tok_ax.plot(gammas, [r.total_tokens for r in series], "-o", label=label)
        lows += [_bounds(r)[0] for r in series]
        highs += [_bounds(r)[1] for r in series]
    acc_ax.set_ylim(*accuracy_limits(lows, highs))
    tok_ax.set_ylim(bottom=0)
    acc_ax.set(xlabel="gamma", ylabel="accuracy (%), bars: 95% CI", title="Accuracy vs gamma")
    tok_ax.set(xlabel="gamma", ylabel="total tokens per question", title="Tokens vs gamma")
    for ax in (acc_ax, tok_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def save_figure(fig: Figure | None, path: Path) -> Path | None:
    """Write `fig` (None: no figure, nothing written) to `path`."""
    if fig is None:
        return None
    fig.savefig(path, dpi=130)
    return path
