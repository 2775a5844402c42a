"""Paper-style tables and plots recomputed from a folder's records (`mur report`, cli/report.py).
One row per setting (dataset, strategy, gate label, gamma), as in the paper's Table 1 (the
columns: evals.report.rows.Row), then the average over datasets when there are several, the
headline (evals.report.headlines), MUR's settings against its default (evals.report.choices)
and the busy wall clock of the whole run across resumed sessions. Writes report.md,
report.json, accuracy_vs_tokens.png and (for a gamma list) gamma_sweep.png beside the records.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from mur.evals.harness.provenance import served_by
from mur.evals.harness.records import has_records, load_records
from mur.evals.harness.run_record import RunRecord
from mur.evals.report import stats
from mur.evals.report.choices import Choice, mur_choices
from mur.evals.report.experiment import Evidence, Experiment, decisions_json, decisions_markdown
from mur.evals.report.headlines import HEADLINE_GAMMA, Headline, headline_json, headlines
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
from mur.evals.report.plots import accuracy_figure, gamma_figure, save_figure
from mur.evals.report.rows import Row, RunTime
from mur.evals.report.trace_report import trace_section
from mur.evals.report.traces import has_traces, load_arm


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
    return sorted(rows, key=lambda r: setting_order((r.dataset, r.strategy, r.gate, r.gamma)))


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
        tokens_vs_always=pairing.tokens_ratio if pairing and pairing.reference_tokens else None,
        steps_total=steps_total,
        steps_scaled=steps_scaled,
        scaled_share=setting.scaled_share(),
        wall_mean=stats.mean(latency),
        wall_p50=stats.percentile(latency, 50),
        wall_p95=stats.percentile(latency, 95),
    )


POINT_ESTIMATES = tuple(f.name for f in fields(Row) if f.type == "float")
"""The numbers every row has (the plain float fields): those an average row averages."""


def _averages(rows: Sequence[Row]) -> list[Row]:
    """The unweighted mean over datasets of each (strategy, gate, gamma), like the paper's Avg:
    point estimates only (intervals and tests are per dataset, where questions pair)."""
    by_setting: dict[tuple[str, str, float | None], list[Row]] = defaultdict(list)
    for row in rows:
        by_setting[(row.strategy, row.gate, row.gamma)].append(row)
    averaged = []
    for (strategy, gate, gamma), group in by_setting.items():
        means: dict[str, Any] = {
            name: stats.mean([getattr(r, name) for r in group]) for name in POINT_ESTIMATES
        }
        averaged.append(
            Row(
                dataset=AVERAGE,
                strategy=strategy,
                gate=gate,
                gamma=gamma,
                questions=sum(r.questions for r in group),
                runs=sum(r.runs for r in group),
                **means,
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


READS = {"traces": "a folder of one setting's traces", "folders": "several run folders combined"}

Appendix = Callable[[Sequence[RunRecord]], tuple[str, str, Any]]
"""A section after the tables, from the records: its markdown, its report.json key and value."""


def write_report(
    folder: str | Path,
    *,
    experiments: Sequence[Experiment] = (),
    headline_gamma: float = HEADLINE_GAMMA,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
    sources: Sequence[str | Path] = (),
    live: Mapping[str, str | Path] | None = None,
    appendices: Sequence[Appendix] = (),
) -> Report:
    """Recompute every table and plot of a run folder from its records (plain and packed).

    With `sources` (several run folders, e.g. one per strategy) the report combines their
    records into `folder`. The first of `experiments` that reads what the records are (a
    folder of one setting's traces, or several folders combined) decides its hypotheses; a
    folder of traces replays its rules, with the `live` folders (by name) beside them. Each of
    `appendices` adds its section last."""
    folder = Path(folder)
    records, named = _gathered(folder, sources, live or {})
    traced = has_traces(records)
    combined = bool(sources or named)
    reads = "traces" if traced else "folders" if combined else None
    experiment = _chosen(experiments, reads, folder, named=bool(named))
    arms = [load_arm(name, path) for name, path in (live or {}).items()] if traced else []
    folder.mkdir(parents=True, exist_ok=True)
    rows = summarize(records, resamples=resamples, seed=seed)
    heads = headlines(records, headline_gamma, resamples=resamples, seed=seed)
    choices = mur_choices(records, headline_gamma, resamples=resamples, seed=seed)
    timing = run_time(records)
    plot_path = save_figure(accuracy_figure(rows), folder / PLOT_NAME)
    sweep_path = save_figure(gamma_figure(rows), folder / SWEEP_NAME)
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
    sections: dict[str, Any] = {}  # report.json's entries beside the tables
    if experiment is not None and not traced:
        evidence = Evidence(records, headline_gamma, resamples, seed, named=named)
        sections, table = _claims(experiment, evidence, folder, live or {})
        markdown = f"## The claim, tested\n\n{table}\n\n{markdown}"
    if combined:
        folders = list((live or {}).values()) if named else []
        listed = ", ".join(f"`{source}`" for source in [*sources, *folders])
        markdown = f"Combined from {listed}.\n\n{markdown}"
    traces_plot: Path | None = None
    if traced:
        section, sections["traces"], traces_plot = trace_section(
            records,
            folder,
            experiment=experiment,
            arms=arms,
            headline_gamma=headline_gamma,
            resamples=resamples,
            seed=seed,
        )
        markdown = f"{markdown}\n{section}"
    for appendix in appendices:
        section, key, value = appendix(records)
        markdown, sections[key] = f"{markdown}\n{section}", value
    document = {
        "rows": [asdict(r) for r in rows],
        "headlines": [headline_json(h) for h in heads],
        "mur_choices": [{**asdict(c), "pairing": pairing_json(c.pairing)} for c in choices],
        "run_time": asdict(timing),
        **sections,
        "method": {"resamples": resamples, "seed": seed, "confidence": stats.CONFIDENCE},
    }
    markdown_path, json_path = _write(folder, markdown, document)
    return Report(
        rows, heads, choices, markdown, markdown_path, json_path, plot_path, sweep_path, traces_plot
    )


def _claims(
    experiment: Experiment, evidence: Evidence, folder: Path, live: Mapping[str, str | Path]
) -> tuple[dict[str, Any], str]:
    """An experiment that reads several folders decided: its report.json entries, and its
    decisions' table with its own sections after it (each named folder checked first)."""
    for name, path in live.items():
        experiment.check_folder(name, str(path), evidence.named[name])
    decisions = experiment.decide(evidence)
    table = decisions_markdown(experiment, decisions)
    if experiment.sections is not None:
        table = f"{table}\n\n{experiment.sections(evidence, folder)}"
    return decisions_json(experiment, decisions), table


def _gathered(
    folder: Path, sources: Sequence[str | Path], live: Mapping[str, str | Path]
) -> tuple[list[RunRecord], dict[str, list[RunRecord]]]:
    """The report's records, and the named folders' records when they are arms of their own:
    the sources', else the folder's; named folders join them unless they are live rules
    beside a folder of traces."""
    records = [r for source in sources for r in load_records(source)]
    if not records and has_records(folder):
        records = load_records(folder)
    if not live or has_traces(records):
        return records or load_records(folder), {}
    named = {name: load_records(path) for name, path in live.items()}
    return records + [r for arm in named.values() for r in arm], named


def _write(folder: Path, markdown: str, document: dict[str, Any]) -> tuple[Path, Path]:
    """report.md, and report.json as strict JSON."""
    markdown_path, json_path = folder / "report.md", folder / "report.json"
    markdown_path.write_text(markdown)
    json_path.write_text(json.dumps(_finite(document), indent=1, allow_nan=False) + "\n")
    return markdown_path, json_path


def _chosen(
    experiments: Sequence[Experiment], reads: str | None, folder: Path, *, named: bool
) -> Experiment | None:
    """The first experiment that reads what the records are (one named alone must); folders
    named without traces beside them must be the arms of the one chosen."""
    chosen = next((e for e in experiments if e.reads == reads), None)
    if chosen is None and len(experiments) == 1:
        wanted = experiments[0]
        held = READS.get(reads or "", "one run folder without traces")
        raise ValueError(
            f"{wanted.name} ({wanted.document}) decides on {READS[wanted.reads]}; "
            f"these records are {held}"
        )
    if named and (chosen is None or not chosen.arms):
        raise ValueError(
            f"--live names the live rules beside recorded traces, or the arms of an "
            f"experiment that reads several folders; {folder} holds no traces"
        )
    return chosen


def _finite(value: Any) -> Any:
    """NaN (an undefined number) as JSON null, so report.json is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
