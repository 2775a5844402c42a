"""Paper-style tables and plots recomputed from a folder's records.

    mur report DIR [--headline-gamma 0.9] [--resamples 10000] [--seed 0]

One row per setting (dataset, strategy, gate label, gamma), as in the paper's Table 1:
accuracy with a 95% bootstrap interval over questions, the paired comparison against the
`always` gate (Per-Step Scale) on the questions both ran (accuracy difference with its
interval, exact sign test = McNemar's), backbone / external / total tokens per question and
against always, scaled and total steps, wall time per question. Then the average over
datasets when there are several, the headline (`evals.report.headlines`: MUR against always
and against random at its rate), MUR's settings against its default (`evals.report.choices`)
and the
busy wall clock of the whole run across resumed sessions (from each record's finished_at and
latency). Writes report.md, report.json, accuracy_vs_tokens.png and (for a gamma list)
gamma_sweep.png beside the records.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from mur.evals.harness.provenance import served_by
from mur.evals.harness.records import load_records
from mur.evals.harness.run_record import RunRecord, setting_of
from mur.evals.report import stats
from mur.evals.report.choices import Choice, mur_choices
from mur.evals.report.headlines import HEADLINE_GAMMA, Headline, headline_json, headlines
from mur.evals.report.hypotheses import hypothesis_tests
from mur.evals.report.hypotheses import to_markdown as hypotheses_markdown
from mur.evals.report.live import load_arm
from mur.evals.report.markdown import to_markdown
from mur.evals.report.pairing import (
    AVERAGE,
    REFERENCE_GATE,
    SettingKey,
    SettingRuns,
    group_settings,
    mean_over,
    pair,
    pairing_json,
    setting_order,
)
from mur.evals.report.plots import plot_accuracy_vs_tokens, plot_gamma_sweep
from mur.evals.report.preregs import PREREGS
from mur.evals.report.rows import Row, RunTime
from mur.evals.report.trace_report import (
    DEFAULT_PREREG,
    online_check,
    online_markdown,
    trace_section,
)
from mur.servers.cli import OneLineParser, positive_float, positive_int


@dataclass(frozen=True)
class Report:
    rows: list[Row]
    headlines: list[Headline]
    choices: list[Choice]
    markdown: str
    markdown_path: Path
    json_path: Path
    plot_path: Path | None
    sweep_path: Path | None
    traces_plot_path: Path | None


def run_time(records: Sequence[RunRecord]) -> RunTime:
    """Busy wall-clock time of the timed records (see `RunTime`)."""
    intervals = []
    for record in records:
        finished_at = record.get("finished_at")
        if finished_at:
            end = datetime.fromisoformat(finished_at).timestamp()
            intervals.append((end - float(record["latency_s"]), end))
    return RunTime(len(intervals), len(records), stats.busy_seconds(intervals))


def row_order(row: Row) -> tuple:
    return setting_order((row.dataset, row.strategy, row.gate, row.gamma))


def summarize(
    records: Sequence[RunRecord], *, resamples: int = stats.RESAMPLES, seed: int = stats.SEED
) -> list[Row]:
    """One row per setting, plus the average over datasets when there are several."""
    settings = group_settings(records)
    rows = [
        _row(key, setting, settings.get((key[0], key[1], REFERENCE_GATE, None)), resamples, seed)
        for key, setting in settings.items()
    ]
    if len({row.dataset for row in rows}) > 1:
        rows += _averages(rows)
    return sorted(rows, key=row_order)


def _row(
    key: SettingKey, setting: SettingRuns, always: SettingRuns | None, resamples: int, seed: int
) -> Row:
    dataset, strategy, gate, gamma = key
    scores = setting.scores()
    accuracy = stats.bootstrap_interval(list(scores.values()), resamples=resamples, seed=seed)
    backbone = mean_over(setting.per_question(lambda r: r["usage"]["backbone_tokens"]))
    external = mean_over(setting.per_question(lambda r: r["usage"]["external_tokens"]))
    steps_total = mean_over(setting.per_question(lambda r: r["steps_total"]))
    steps_scaled = mean_over(setting.per_question(lambda r: r["steps_scaled"]))
    latency = [float(r["latency_s"]) for r in setting.records]
    pairing = pair(setting, always, resamples=resamples, seed=seed) if always else None
    paired = pairing.comparison if pairing else None
    tokens_vs_always = (
        pairing.tokens / pairing.reference_tokens if pairing and pairing.reference_tokens else None
    )
    return Row(
        dataset=dataset,
        strategy=strategy,
        gate=gate,
        gamma=gamma,
        questions=len(scores),
        runs=len(setting.records),
        accuracy=mean_over(scores),
        accuracy_low=accuracy.low if accuracy else None,
        accuracy_high=accuracy.high if accuracy else None,
        paired_questions=paired.n if paired else None,
        accuracy_diff=paired.difference if paired else None,
        accuracy_diff_low=paired.interval.low if paired and paired.interval else None,
        accuracy_diff_high=paired.interval.high if paired and paired.interval else None,
        better=paired.better if paired else None,
        worse=paired.worse if paired else None,
        p_value=paired.p_value if paired else None,
        backbone_tokens=backbone,
        external_tokens=external,
        total_tokens=backbone + external,
        tokens_vs_always=tokens_vs_always,
        steps_total=steps_total,
        steps_scaled=steps_scaled,
        scaled_share=setting.scaled_share(),
        wall_mean=stats.mean(latency),
        wall_p50=stats.percentile(latency, 50),
        wall_p95=stats.percentile(latency, 95),
    )


def _averages(rows: Sequence[Row]) -> list[Row]:
    """The unweighted mean over datasets of each (strategy, gate, gamma), like the paper's Avg:
    point estimates only (intervals and tests are per dataset, where questions pair)."""
    by_setting: dict[tuple[str, str, float | None], list[Row]] = defaultdict(list)
    for row in rows:
        by_setting[(row.strategy, row.gate, row.gamma)].append(row)
    averaged = []
    for (strategy, gate, gamma), group in by_setting.items():
        averaged.append(
            Row(
                dataset=AVERAGE,
                strategy=strategy,
                gate=gate,
                gamma=gamma,
                questions=sum(r.questions for r in group),
                runs=sum(r.runs for r in group),
                accuracy=stats.mean([r.accuracy for r in group]),
                accuracy_low=None,
                accuracy_high=None,
                paired_questions=None,
                accuracy_diff=None,
                accuracy_diff_low=None,
                accuracy_diff_high=None,
                better=None,
                worse=None,
                p_value=None,
                backbone_tokens=stats.mean([r.backbone_tokens for r in group]),
                external_tokens=stats.mean([r.external_tokens for r in group]),
                total_tokens=stats.mean([r.total_tokens for r in group]),
                tokens_vs_always=None,
                steps_total=stats.mean([r.steps_total for r in group]),
                steps_scaled=stats.mean([r.steps_scaled for r in group]),
                scaled_share=stats.mean([r.scaled_share for r in group]),
                wall_mean=stats.mean([r.wall_mean for r in group]),
                wall_p50=stats.mean([r.wall_p50 for r in group]),
                wall_p95=stats.mean([r.wall_p95 for r in group]),
            )
        )
    always = {r.strategy: r.total_tokens for r in averaged if r.gate == REFERENCE_GATE}
    return [
        replace(r, tokens_vs_always=r.total_tokens / always[r.strategy])
        if always.get(r.strategy)
        else r
        for r in averaged
    ]


PLOT_NAME = "accuracy_vs_tokens.png"
SWEEP_NAME = "gamma_sweep.png"


def has_traces(records: Sequence[RunRecord]) -> bool:
    """Several samples of one setting: independent traces, analysed as such (trace_report)."""
    settings = {setting_of(r["strategy"], r["gate"], r["gamma"]) for r in records}
    return len(settings) == 1 and any(r["sample"] > 0 for r in records)


def write_report(
    folder: str | Path,
    *,
    headline_gamma: float = HEADLINE_GAMMA,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
    sources: Sequence[str | Path] = (),
    predicted_by: str | Path | None = None,
    prereg: str = DEFAULT_PREREG,
    live: Mapping[str, str | Path] | None = None,
) -> Report:
    """Recompute every table and plot of a run folder from its records (plain and packed).

    With `sources` (several run folders, e.g. one per strategy) the report combines their
    records into `folder`, and adds the pre-registered hypotheses per strategy and pooled
    (`evals.report.hypotheses`). With `predicted_by` (a folder of recorded traces) it adds
    the online check of this folder's live trace rule against their replays. A folder of
    traces decides the hypotheses of `prereg` (evals.report.preregs), with the `live` folders
    (by name) beside its replayed rules."""
    folder = Path(folder)
    if prereg not in PREREGS:
        raise ValueError(f"unknown pre-registration {prereg!r}: choose one of {', '.join(PREREGS)}")
    arms = [load_arm(name, path) for name, path in (live or {}).items()]
    records = [r for source in sources for r in load_records(source)] or load_records(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = summarize(records, resamples=resamples, seed=seed)
    heads = headlines(records, headline_gamma, resamples=resamples, seed=seed)
    choices = mur_choices(records, headline_gamma, resamples=resamples, seed=seed)
    timing = run_time(records)
    plot_path = plot_accuracy_vs_tokens(rows, folder / PLOT_NAME)
    sweep_path = plot_gamma_sweep(rows, folder / SWEEP_NAME)
    markdown = to_markdown(
        rows,
        heads,
        source=folder,
        headline_gamma=headline_gamma,
        resamples=resamples,
        seed=seed,
        run_time=timing,
        choices=choices,
        plots=[p.name for p in (plot_path, sweep_path) if p is not None],
        served={str(f): served_by(f) for f in [*(sources or [folder]), *(live or {}).values()]},
    )
    tests = hypothesis_tests(records, headline_gamma, resamples=resamples, seed=seed)
    if sources:
        listed = ", ".join(f"`{source}`" for source in sources)
        markdown = f"Combined from {listed}.\n\n{hypotheses_markdown(tests)}\n{markdown}"
    traces: dict[str, Any] = {}
    traces_plot: Path | None = None
    if has_traces(records):
        section, traces, traces_plot = trace_section(
            records, folder, prereg=prereg, arms=arms, resamples=resamples, seed=seed
        )
        markdown = f"{markdown}\n{section}"
    elif arms:
        raise ValueError(f"--live compares with recorded traces, and {folder} holds none")
    online: dict[str, Any] = {}
    if predicted_by is not None:
        check = online_check(load_records(predicted_by), records)
        markdown = f"{markdown}\n{online_markdown(check, str(predicted_by))}"
        online = {"predicted_by": str(predicted_by), "passes": check.passes, **asdict(check)}
    markdown_path = folder / "report.md"
    json_path = folder / "report.json"
    markdown_path.write_text(markdown)
    document = {
        "rows": [asdict(r) for r in rows],
        "headlines": [headline_json(h) for h in heads],
        "mur_choices": [{**asdict(c), "pairing": pairing_json(c.pairing)} for c in choices],
        "run_time": asdict(timing),
        **({"hypotheses": [asdict(t) for t in tests]} if sources else {}),
        **({"traces": traces} if traces else {}),
        **({"online_check": online} if online else {}),
        "method": {"resamples": resamples, "seed": seed, "confidence": stats.CONFIDENCE},
    }
    json_path.write_text(json.dumps(_finite(document), indent=1, allow_nan=False) + "\n")
    return Report(
        rows, heads, choices, markdown, markdown_path, json_path, plot_path, sweep_path, traces_plot
    )


def _finite(value: Any) -> Any:
    """NaN (an undefined number) as JSON null, so report.json is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


PROG = "mur report"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description="Tables and plots from a run's records.")
    parser.add_argument(
        "run_dirs",
        nargs="+",
        metavar="run_dir",
        help="a folder of benchmark records (mur solve --out); several, with --out, combine",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="with several folders: where the combined report.md and plots go (the "
        "hypotheses H1-H3 per strategy and pooled are added)",
    )
    parser.add_argument(
        "--headline-gamma",
        type=positive_float,
        default=HEADLINE_GAMMA,
        help="the MUR gamma the headline compares with always (default 0.9, the paper's)",
    )
    parser.add_argument(
        "--resamples", type=positive_int, default=stats.RESAMPLES, help="bootstrap resamples"
    )
    parser.add_argument("--seed", type=int, default=stats.SEED, help="bootstrap seed")
    parser.add_argument(
        "--predicted-by",
        type=Path,
        metavar="DIR",
        help="the online check: run_dir holds a live run of one trace rule, DIR the same "
        "questions' recorded traces; the report adds whether the live accuracy and tokens "
        "fall where replaying the rule on DIR predicts",
    )
    parser.add_argument(
        "--prereg",
        choices=tuple(PREREGS),
        default=DEFAULT_PREREG,
        help="a folder of traces: whose pre-registered hypotheses to decide "
        + "; ".join(f"{p.name}: {p.document}" for p in PREREGS.values()),
    )
    parser.add_argument(
        "--live",
        type=_named_folder,
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a folder of traces: a live run of a trace rule on (some of) its questions, shown "
        "beside the replayed rules against majority@K; the pre-registration reads its arms by "
        "name (branching-fresh: mur, random, eager)",
    )
    return parser


def _named_folder(text: str) -> tuple[str, Path]:
    name, sep, folder = text.partition("=")
    if not sep or not name or not folder:
        raise argparse.ArgumentTypeError(f"expected NAME=DIR, got {text!r}")
    return name, Path(folder)


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Write and print the report of one folder (or of several, combined into --out)."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    names = [name for name, _ in args.live]
    if repeated := sorted({n for n in names if names.count(n) > 1}):
        parser.error(f"--live names each arm once: {', '.join(repeated)} given twice")
    if len(args.run_dirs) > 1 and args.out is None:
        parser.error("several folders combine into one report: name it with --out DIR")
    combined = len(args.run_dirs) > 1 or args.out is not None
    try:
        report = write_report(
            args.out if combined else args.run_dirs[0],
            headline_gamma=args.headline_gamma,
            resamples=args.resamples,
            seed=args.seed,
            sources=args.run_dirs if combined else (),
            predicted_by=args.predicted_by,
            prereg=args.prereg,
            live=dict(args.live),
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    print(report.markdown)
    written = [
        report.markdown_path,
        report.json_path,
        report.plot_path,
        report.sweep_path,
        report.traces_plot_path,
    ]
    print("written: " + ", ".join(str(p) for p in written if p), file=sys.stderr)
    return 0
