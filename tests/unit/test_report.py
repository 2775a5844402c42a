"""Reports from records: statistics with known answers, tables, plots, degenerate inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mur.cli.report import main
from mur.evals.report import stats
from mur.evals.report.headlines import headlines
from mur.evals.report.markdown import to_markdown
from mur.evals.report.plots import accuracy_figure, accuracy_limits, gamma_figure
from mur.evals.report.tables import summarize, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def record(
    question: int | str,
    gate: str,
    correct: bool,
    *,
    gamma: float | None = None,
    dataset: str = "math500",
    backbone: int = 100,
    external: int = 0,
    steps: int = 4,
    scaled: int = 0,
    latency: float = 1.0,
    sample: int = 0,
    finished_at: str | None = None,
) -> dict:
    """A record as evals.harness.run_record.make_record writes it (the fields the report reads)."""
    problem_id = f"test/{question}.json"
    return {
        "key": f"{dataset}/{problem_id}/critic/{gate}/{'-' if gamma is None else gamma}/{sample}",
        "dataset": dataset,
        "problem_id": problem_id,
        "strategy": "critic",
        "gate": gate,
        "gamma": gamma,
        "sample": sample,
        "gold": "1",
        "answer": "1" if correct else "2",
        "correct": correct,
        "usage": {"backbone_tokens": backbone, "external_tokens": external},
        "steps_total": steps,
        "steps_scaled": scaled,
        "finish_reason": "answer",
        "latency_s": latency,
        **({"finished_at": finished_at} if finished_at else {}),
        "trace": {},
    }


def write_records(folder: Path, records: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def by_gate(rows):
    return {(r.dataset, r.gate, r.gamma): r for r in rows}


# --------------------------------------------------------------------------- statistics


def test_exact_sign_test_matches_the_binomial_by_hand() -> None:
    # 1 of 6 discordant pairs: P(X <= 1) = (1 + 6) / 2^6, doubled for two sides.
    assert stats.exact_sign_test(1, 5) == pytest.approx(14 / 64)
    assert stats.exact_sign_test(5, 1) == pytest.approx(14 / 64)
    # 0 of 8: 2 / 2^8.
    assert stats.exact_sign_test(0, 8) == pytest.approx(2 / 256)
    assert stats.exact_sign_test(3, 3) == 1.0
    assert stats.exact_sign_test(0, 0) == 1.0  # no discordant question: no evidence


def test_bootstrap_of_two_questions_spans_both() -> None:
    # Resampled means of [0, 1] are 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4: the 2.5th and
    # 97.5th percentiles are 0 and 1.
    interval = stats.bootstrap_interval([0.0, 1.0])
    assert (interval.low, interval.high) == (0.0, 1.0)


@pytest.mark.parametrize(
    "values",
    [[1, 0, 1, 1, 0, 1, 0, 0, 1, 1], [1] * 30 + [0], [0, 0, 0, 1], [0.5, 1, 0, 0.25]],
)
def test_bootstrap_interval_holds_the_estimate_within_0_1(values: list[float]) -> None:
    interval = stats.bootstrap_interval(values)
    estimate = sum(values) / len(values)
    assert 0.0 <= interval.low <= estimate <= interval.high <= 1.0
    assert interval.low < interval.high
    assert stats.bootstrap_interval(values) == interval  # seeded: the same table every time


def test_bootstrap_degenerate_inputs() -> None:
    assert stats.bootstrap_interval([]) is None
    assert stats.bootstrap_interval([1.0]) is None  # one question says nothing about spread
    assert stats.bootstrap_interval([1.0] * 5) == stats.Interval(1.0, 1.0)
    assert stats.bootstrap_interval([0.0] * 5) == stats.Interval(0.0, 0.0)


def test_paired_comparison_uses_only_common_questions() -> None:
    setting = {"a": 1.0, "b": 0.0, "c": 1.0, "only-here": 1.0}
    reference = {"a": 0.0, "b": 0.0, "c": 0.0, "only-there": 0.0}
    comparison = stats.compare_paired(setting, reference)
    assert (comparison.n, comparison.better, comparison.worse) == (3, 2, 0)
    assert comparison.difference == pytest.approx(2 / 3)
    assert comparison.p_value == pytest.approx(0.5)  # 2 of 2: 2 * (1/4)
    assert -1.0 <= comparison.interval.low <= 2 / 3 <= comparison.interval.high <= 1.0
    assert stats.compare_paired({"a": 1.0}, {"b": 1.0}) is None


# --------------------------------------------------------------------------- rows


def test_rows_recompute_from_records() -> None:
    # 6 questions; mur solves q0 that always misses, always solves q1..q5 that mur misses.
    records = [record(q, "always", q != 0, backbone=300, external=200, steps=5, scaled=5,
                      latency=float(q + 1)) for q in range(6)]  # fmt: skip
    records += [record(q, "mur", q == 0, gamma=0.9, backbone=200, external=50, steps=4,
                       scaled=1) for q in range(6)]  # fmt: skip
    rows = by_gate(summarize(records))
    always, mur = rows[("math500", "always", None)], rows[("math500", "mur", 0.9)]
    assert (always.accuracy, mur.accuracy) == (pytest.approx(5 / 6), pytest.approx(1 / 6))
    assert (mur.paired_questions, mur.better, mur.worse) == (6, 1, 5)
    assert mur.p_value == pytest.approx(14 / 64)
    assert mur.accuracy_diff == pytest.approx(-4 / 6)
    assert mur.accuracy_diff_low <= -4 / 6 <= mur.accuracy_diff_high
    assert mur.total_tokens == 250 and always.total_tokens == 500
    assert mur.tokens_vs_always == pytest.approx(0.5)
    assert (mur.steps_total, mur.steps_scaled, mur.scaled_share) == (4, 1, 0.25)
    assert always.wall_mean == pytest.approx(3.5) and always.wall_p50 == pytest.approx(3.5)
    assert always.wall_p95 == pytest.approx(5.75)  # numpy's linear interpolation
    assert always.p_value == 1.0 and always.accuracy_diff == 0.0
    assert 0.0 <= mur.accuracy_low <= mur.accuracy <= mur.accuracy_high <= 1.0


def test_samples_average_within_a_question_first() -> None:
    # q0: one correct sample; q1: three wrong samples. Per question: 1 and 0 -> 50%, not 25%.
    records = [record(0, "never", True)] + [record(1, "never", False, sample=s) for s in range(3)]
    (row,) = summarize(records)
    assert (row.questions, row.runs, row.accuracy) == (2, 4, 0.5)


def test_paired_columns_and_token_ratio_on_shared_questions_only() -> None:
    records = [record(q, "always", True, backbone=100) for q in range(3)]
    records += [record(q, "mur", True, gamma=0.9, backbone=50) for q in range(4)]
    records.append(record(3, "mur", True, gamma=0.9, backbone=10_000, sample=1))  # q3 unpaired
    mur = by_gate(summarize(records))[("math500", "mur", 0.9)]
    assert mur.questions == 4 and mur.paired_questions == 3
    assert mur.tokens_vs_always == pytest.approx(0.5)  # q3's 10,000 tokens are not compared


def test_averages_over_datasets_are_point_estimates() -> None:
    records = [
        record(0, "always", True, backbone=300),
        record(1, "always", False, backbone=300),
        record(0, "mur", True, gamma=0.9, backbone=105),
        record(1, "mur", True, gamma=0.9, backbone=105),
        record(0, "always", False, dataset="aime24", backbone=1000),
        record(0, "mur", False, gamma=0.9, dataset="aime24", backbone=500),
    ]
    rows = by_gate(summarize(records))
    average = rows[("average", "mur", 0.9)]
    assert average.accuracy == pytest.approx(0.5)
    assert average.total_tokens == pytest.approx((105 + 500) / 2)
    assert average.tokens_vs_always == pytest.approx(((105 + 500) / 2) / ((300 + 1000) / 2))
    assert average.accuracy_low is None and average.p_value is None


# --------------------------------------------------------------------------- report files


def test_report_writes_markdown_json_and_png(tmp_path: Path) -> None:
    records = [record(q, "always", q % 2 == 0, backbone=400) for q in range(8)]
    records += [record(q, "never", q % 4 == 0, backbone=150) for q in range(8)]
    for gamma in (0.5, 0.9, 1.2):
        records += [record(q, "mur", q % 3 == 0, gamma=gamma, backbone=int(300 * gamma))
                    for q in range(8)]  # fmt: skip
    records += [record(q, "mur+bc", q % 2 == 0, gamma=0.9, backbone=250) for q in range(8)]
    report = write_report(write_records(tmp_path / "run", records), resamples=2000)
    for path in (report.plot_path, report.sweep_path):
        assert path is not None and path.read_bytes().startswith(PNG_MAGIC)
    assert report.plot_path.name == "accuracy_vs_tokens.png"
    document = json.loads(report.json_path.read_text(), parse_constant=_reject_nan)
    assert len(document["rows"]) == 6 and document["method"]["resamples"] == 2000
    markdown = report.markdown_path.read_text()
    assert "![accuracy_vs_tokens.png](accuracy_vs_tokens.png)" in markdown
    assert "| mur | 0.9 | 8 | 37.5 [" in markdown  # q0, q3, q6 of 8
    assert "| mur+bc | 0.9 |" in markdown
    # The headline: mur at gamma 0.9 has 270 tokens against always's 400.
    (mur, bias_corrected) = report.headlines
    assert (mur.gate, bias_corrected.gate) == ("mur", "mur+bc")
    assert mur.tokens_ratio == pytest.approx(270 / 400)
    assert "0.68x the tokens of always (270 vs 400 per question)" in markdown
    assert "a difference of -12.5 points (95% paired bootstrap interval" in markdown
    assert "exact McNemar p = 1.000 (1 question better, 2 worse)" in markdown  # 2*(1+3)/8
    assert "on the 8 questions both ran" in markdown


def _reject_nan(name: str) -> float:
    raise AssertionError(f"report.json holds {name}")


def test_report_without_always_says_so_and_drops_paired_columns(tmp_path: Path) -> None:
    records = [record(q, "mur", q == 0, gamma=0.9) for q in range(4)]
    records += [record(q, "never", False) for q in range(4)]
    report = write_report(write_records(tmp_path, records), resamples=500)
    assert report.headlines == []
    assert all(r.paired_questions is None and r.tokens_vs_always is None for r in report.rows)
    assert "No `always` runs for this dataset and strategy" in report.markdown
    assert "no `always` runs, so no comparison" in report.markdown
    assert "| paired n |" not in report.markdown and "| vs always |" not in report.markdown


def test_report_without_mur_runs_has_no_headline_section(tmp_path: Path) -> None:
    """A baseline folder (here never and always) has no MUR to headline: no empty section."""
    records = [record(q, gate, q == 0) for q in range(4) for gate in ("never", "always")]
    report = write_report(write_records(tmp_path, records), resamples=200)
    assert "## Headline" not in report.markdown
    assert "## math500 / critic (up to 4 questions)" in report.markdown


def test_busy_seconds_counts_overlaps_once_and_pauses_not_at_all() -> None:
    assert stats.busy_seconds([(0, 10), (5, 12), (20, 25)]) == 17
    assert stats.busy_seconds([(2, 3), (0, 10)]) == 10  # nested
    assert stats.busy_seconds([]) == 0


def test_report_states_the_busy_wall_clock_across_sessions(tmp_path: Path) -> None:
    # Session 1: two runs overlapping from 10:00 to 10:40; session 2 the next day, 20 min;
    # one run from before the stamp existed.
    records = [
        record(0, "always", True, latency=1800, finished_at="2026-11-21T10:30:00.000+00:00"),
        record(1, "always", True, latency=1800, finished_at="2026-11-21T10:40:00.000+00:00"),
        record(2, "always", True, latency=1200, finished_at="2026-11-22T08:20:00.000+00:00"),
        record(3, "always", True),
    ]
    report = write_report(write_records(tmp_path, records), resamples=200)
    assert (
        "Wall clock: the 3 timed runs kept the server busy for 1 h 00 min (the union of their "
        "run intervals" in report.markdown
    )
    assert "; 1 earlier runs carry no timestamp." in report.markdown
    document = json.loads(report.json_path.read_text())
    assert document["run_time"] == {"timed_runs": 3, "runs": 4, "busy_s": 3600.0}


def test_headline_names_the_random_rate_that_matches_mur() -> None:
    # MUR scaled 1 of the 4 steps after the first in q0 and 2 of 4 in q1: 3 of 8 eligible.
    records = [record(q, "always", True, steps=5, scaled=5) for q in range(2)]
    records += [record(0, "mur", True, gamma=0.9, steps=5, scaled=1)]
    records += [record(1, "mur", True, gamma=0.9, steps=5, scaled=2)]
    (head,) = headlines(records)
    assert head.random_rate == pytest.approx(3 / 8)
    assert head.against_random is None
    assert (
        "Random at its rate (the matched baseline, not run here): `--gate random@0.375`."
        in to_markdown(summarize(records), [head])
    )


def test_headline_pairs_mur_with_the_random_run_at_its_rate(tmp_path: Path) -> None:
    # MUR scales 1 of 4 eligible steps (rate 0.25) and is right on q0-q2; random@0.26 (within
    # 10%) only on q0; random@0.5 is further from MUR's rate and must not be the one chosen.
    records = [record(q, "always", True, steps=5, scaled=5) for q in range(3)]
    records += [record(q, "mur", True, gamma=0.9, steps=5, scaled=1) for q in range(3)]
    records += [record(q, "random@0.26", q == 0, steps=5, scaled=1, backbone=200)
                for q in range(3)]  # fmt: skip
    records += [record(q, "random@0.5", True, steps=5, scaled=2) for q in range(3)]
    report = write_report(write_records(tmp_path, records), resamples=100)
    (head,) = report.headlines
    match = head.against_random
    assert match is not None and match.gate == "random@0.26" and match.one_sample
    assert match.scaled_share == pytest.approx(0.2)
    assert (match.pairing.accuracy, match.pairing.reference_accuracy) == (1.0, pytest.approx(1 / 3))
    assert (match.pairing.comparison.better, match.pairing.comparison.worse) == (2, 0)
    assert match.pairing.tokens_ratio == pytest.approx(0.5)
    assert (
        "Against random at its rate (`random@0.26`, which scaled 20.0% of steps): 0.50x its "
        "tokens (100 vs 200); accuracy 100.0% vs 33.3%, a difference of +66.7 points"
    ) in report.markdown
    (document,) = json.loads(report.json_path.read_text())["headlines"]
    assert document["against_random"]["gate"] == "random@0.26"
    assert document["against_random"]["pairing"]["tokens_ratio"] == pytest.approx(0.5)


def test_a_random_run_far_from_murs_rate_is_no_match() -> None:
    records = [record(0, "always", True), record(0, "mur", True, gamma=0.9, steps=5, scaled=1)]
    records += [record(0, "random@0.3", True, steps=5, scaled=1)]  # MUR's rate is 0.25
    (head,) = headlines(records)
    assert head.against_random is None


def test_headline_with_several_samples_names_the_sign_test() -> None:
    records = [record(q, g, q == 0, sample=s) for q in range(3) for g in ("always",)
               for s in range(2)]  # fmt: skip
    records += [record(q, "mur", True, gamma=0.9, sample=s) for q in range(3) for s in range(2)]
    (head,) = headlines(records)
    assert not head.one_sample and (head.comparison.better, head.comparison.worse) == (2, 0)
    assert "exact sign test (samples averaged per question) p = 0.500" in to_markdown(
        summarize(records), [head]
    )


def test_headline_at_a_missing_gamma_names_the_ones_run(tmp_path: Path) -> None:
    records = [record(0, "always", True), record(0, "mur", True, gamma=0.7)]
    report = write_report(write_records(tmp_path, records), headline_gamma=0.9, resamples=100)
    assert report.headlines == []
    assert "no `mur` runs at gamma 0.9 (mur gammas here: 0.7)" in report.markdown
    assert headlines([record(0, "always", True), record(0, "mur", True, gamma=0.7)], 0.7)


@pytest.mark.parametrize(
    ("case", "records"),
    [
        ("single setting, one question", [record(0, "never", True)]),
        ("all correct", [record(q, g, True) for q in range(5) for g in ("always", "never")]),
        ("all wrong", [record(q, g, False) for q in range(5) for g in ("always", "never")]),
        (
            "all wrong, with a sweep",
            [record(q, "mur", False, gamma=g) for q in range(3) for g in (0.5, 0.9)],
        ),
    ],
)
def test_degenerate_tables_keep_sane_axes(tmp_path: Path, case: str, records: list) -> None:
    report = write_report(write_records(tmp_path, records), resamples=500)
    assert report.plot_path.read_bytes().startswith(PNG_MAGIC), case
    for row in report.rows:
        for value in (row.accuracy, row.accuracy_low, row.accuracy_high):
            assert value is None or 0.0 <= value <= 1.0
    figures = [accuracy_figure(report.rows), gamma_figure(report.rows)]
    for figure in filter(None, figures):
        accuracy_axes = [ax for ax in figure.axes if "accuracy" in ax.get_ylabel()]
        assert accuracy_axes
        for ax in accuracy_axes:
            bottom, top = ax.get_ylim()
            assert 0.0 <= bottom < top <= 100.0 and top - bottom >= 5.0, case
            assert ax.get_xlim()[0] >= 0.0 or "gamma" in ax.get_xlabel()
    if len(report.rows) == 1 and report.rows[0].questions == 1:
        assert "(n=1: no interval)" in report.markdown


def test_the_plot_marks_settings_on_fewer_questions() -> None:
    # A table stopped part-way: the sweep's gamma 0.7 and mur+bc have 2 of the 4 questions.
    records = [record(q, gate, True) for q in range(4) for gate in ("never", "always")]
    records += [record(q, "mur", True, gamma=g) for q in range(4) for g in (0.9,)]
    records += [record(q, "mur", True, gamma=0.7) for q in range(2)]
    records += [record(q, "mur+bc", True, gamma=0.9) for q in range(2)]
    figure = accuracy_figure(summarize(records, resamples=50))
    (ax,) = figure.axes
    assert sorted(t.get_text() for t in ax.texts) == ["γ=0.7, n=2", "γ=0.9"]
    labels = ax.get_legend_handles_labels()[1]
    assert "mur+bc (gamma 0.9, n=2)" in labels and "never" in labels
    assert "(4 questions unless marked)" in ax.get_title()


def test_sweep_labels_of_points_at_nearly_the_same_tokens_do_not_overlap() -> None:
    # As in the critic table: gamma 0.7 and 0.8 spend nearly the same tokens, 0.8 scores higher.
    runs = {0.7: (660, [True, False]), 0.8: (650, [True, True]), 0.95: (1300, [False, False])}
    records = [
        record(q, "mur", correct, gamma=gamma, backbone=tokens)
        for gamma, (tokens, answers) in runs.items()
        for q, correct in enumerate(answers)
    ]
    (ax,) = accuracy_figure(summarize(records, resamples=50)).axes
    offsets = {t.get_text(): t.xyann[1] for t in ax.texts}
    assert offsets["γ=0.8"] > 0 > offsets["γ=0.7"]  # the higher point's label above
    assert offsets["γ=0.95"] > 0  # no neighbour: above, as a single sweep's labels are


def test_accuracy_limits() -> None:
    assert accuracy_limits([0.0], [0.0]) == (0.0, 5.0)
    assert accuracy_limits([100.0], [100.0]) == (95.0, 100.0)
    assert accuracy_limits([30.0, 40.0], [50.0, 60.0]) == (25.0, 65.0)
    assert accuracy_limits([0.0], [100.0]) == (0.0, 100.0)
    bottom, top = accuracy_limits([2.0], [3.0])
    assert bottom == 0.0 and top >= 5.0


def test_markdown_of_a_single_question_pair() -> None:
    rows = summarize([record(0, "always", True), record(0, "mur", False, gamma=0.9)])
    markdown = to_markdown(rows, headlines([record(0, "always", True),
                                            record(0, "mur", False, gamma=0.9)]))  # fmt: skip
    assert "one question: no interval" in markdown
    assert "| mur | 0.9 | 1 | 0.0 (n=1: no interval) | 1 | -100.0 | 0 / 1 | 1.000 |" in markdown


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_records(tmp_path / "run", [record(q, "always", q < 2) for q in range(4)])
    assert main([str(folder), "--resamples", "200", "--seed", "3"]) == 0
    assert "| always | - | 4 | 50.0 [" in capsys.readouterr().out
    assert main([str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no records.jsonl" in err and len(err.splitlines()) == 1
    with pytest.raises(SystemExit) as exit_info:
        main([str(folder), "--resamples", "0"])
    assert exit_info.value.code == 2
    assert "--resamples: must be > 0, got 0" in capsys.readouterr().err


def test_percentile_and_mean_of_nothing_are_nan() -> None:
    assert math.isnan(stats.percentile([], 50)) and math.isnan(stats.mean([]))
