"""Two results folders side by side, paired on the questions both ran."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from test_report import record, write_records

import mur.cli
from mur.cli.compare import main
from mur.evals.harness.records import load_records
from mur.evals.report import stats
from mur.evals.report.compare import (
    compare,
    compare_traces,
    first_samples,
    folder_time,
    non_inferior,
    to_markdown,
    traces_markdown,
)
from mur.evals.report.traces import PRIMARY_SIGNAL


def test_each_shared_setting_is_paired_on_common_questions_only() -> None:
    a = [
        record(1, "always", False, external=300),
        record(2, "always", True, external=300),
        record(3, "always", True, external=300),  # only in A: left out
        record(1, "never", True),  # never is only in A: no row
    ]
    b = [
        record(1, "always", True, external=100),
        record(2, "always", True, external=100),
        record(1, "mur", True, gamma=0.9),  # only in B: no row
    ]
    (row,) = compare(a, b, resamples=200)
    assert row.key == ("math500", "critic", "always", None)
    pairing = row.pairing
    assert pairing.n == 2
    assert (pairing.reference_accuracy, pairing.accuracy) == (0.5, 1.0)
    assert pairing.comparison.difference == pytest.approx(0.5)
    assert pairing.comparison.better == 1
    assert (pairing.reference_tokens, pairing.tokens) == (400, 200)
    table = to_markdown([row], "A", "B")
    assert "| math500 critic always | 2 | 50.0 | 100.0 | +50.0 [+0.0, +100.0] | 1.00 |" in table
    assert "| 400 | 200 | 0.50x |" in table


def test_the_cli_prints_the_table_and_says_when_nothing_is_shared(tmp_path: Path, capsys) -> None:
    a = write_records(tmp_path / "a", [record(1, "never", True), record(1, "always", True)])
    b = write_records(tmp_path / "b", [record(1, "always", False)])
    out = tmp_path / "new" / "compare.md"  # its folder made as needed
    assert main([str(a), str(b), "--out", str(out)]) == 0
    assert "| math500 critic always | 1 |" in capsys.readouterr().out
    assert "math500 critic always" in out.read_text()
    c = write_records(tmp_path / "c", [record(2, "always", True)])
    assert main([str(a), str(c)]) == 1
    assert "share no setting" in capsys.readouterr().err
    assert main([str(a), str(tmp_path / "missing")]) == 2
    assert "no records.jsonl" in capsys.readouterr().err
    with (c / "records.jsonl").open("a") as plain:
        plain.write("oops\n")
    assert main([str(a), str(c)]) == 2
    assert "records.jsonl line 2 is not JSON" in capsys.readouterr().err


# --------------------------------------------------------------------------- --samples


def test_samples_keeps_the_first_n_of_each_folder_and_names_incomplete_questions(
    tmp_path: Path, capsys
) -> None:
    a = write_records(
        tmp_path / "a",
        [
            record(1, "always", True, sample=0),
            record(1, "always", True, sample=1),
            record(2, "always", True, sample=0),
            record(2, "always", True, sample=1),
            record(1, "never", True),
        ],
    )
    b = write_records(
        tmp_path / "b",
        [
            record(1, "always", True, sample=0),
            record(1, "always", False, sample=1),  # dropped by --samples 1
            record(2, "always", False, sample=1),  # question 2 has no sample 0: left out
        ],
    )
    assert main([str(a), str(b)]) == 0
    everything = capsys.readouterr().out
    assert "| math500 critic always | 2 | 100.0 | 25.0 | -75.0 " in everything
    assert "Samples:" not in everything
    assert main([str(a), str(b), "--samples", "1"]) == 0
    first = capsys.readouterr().out
    assert "| math500 critic always | 1 | 100.0 | 100.0 | +0.0 " in first
    assert "only records with sample < 1 (sample 0) enter every number" in first
    assert "A: 3 of 5 runs; questions left out: none." in first
    assert "B: 1 of 3 runs; questions left out: test/2.json." in first


def test_first_samples_names_the_setting_when_a_folder_has_several() -> None:
    records = [record(1, "always", True, sample=1), record(1, "never", True, sample=0)]
    selection = first_samples(records, 2)
    assert selection.records == []
    assert selection.left_out == [
        "math500 critic/always/- test/1.json",
        "math500 critic/never/- test/1.json",
    ]
    assert first_samples(records, None).records == records


# --------------------------------------------------------------------------- --margin


def test_the_margin_verdict_flips_at_the_lower_bound(tmp_path: Path, capsys) -> None:
    # Every question loses one of B's four samples: B - A is -25 points, interval [-25, -25].
    a = write_records(
        tmp_path / "a", [record(q, "always", True, sample=s) for q in (1, 2) for s in range(4)]
    )
    b = write_records(
        tmp_path / "b",
        [record(q, "always", s > 0, sample=s) for q in (1, 2) for s in range(4)],
    )
    (c,) = compare(load_records(a), load_records(b), resamples=200)
    assert c.pairing.comparison.interval == stats.Interval(-0.25, -0.25)
    assert not non_inferior(c.pairing.comparison, -25)  # strictly above: at the bound is no
    assert non_inferior(c.pairing.comparison, -25.1)
    assert main([str(a), str(b), "--margin", "-25"]) == 0
    assert (
        "- math500 critic always: B - A = -25.0 points [-25.0, -25.0]: "
        "non-inferior at -25 points: no\n"
    ) in capsys.readouterr().out
    assert main([str(a), str(b), "--margin", "-25.1"]) == 0
    assert "non-inferior at -25.1 points: yes\n" in capsys.readouterr().out
    assert main([str(a), str(b)]) == 0
    assert "non-inferior" not in capsys.readouterr().out  # no --margin: the table alone


def test_a_single_question_has_no_interval_so_is_not_shown_non_inferior() -> None:
    (c,) = compare([record(1, "always", True)], [record(1, "always", True)], resamples=200)
    assert c.pairing.comparison.interval is None
    assert not non_inferior(c.pairing.comparison, -100)
    assert "+0.0 points (no interval): non-inferior at -2 points: no" in to_markdown(
        [c], "A", "B", margin=-2
    )


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--samples", "0"], "argument --samples: must be > 0, got 0"),
        (["--samples", "two"], "argument --samples: 'two' is not an integer"),
        (["--margin", "minus-two"], "argument --margin: 'minus-two' is not a number"),
        (["--margin", "nan"], "argument --margin: must be a finite number, got nan"),
    ],
)
def test_bad_samples_or_margin_is_one_line_and_exit_2(
    tmp_path: Path, flags: list[str], says: str, capsys
) -> None:
    a = write_records(tmp_path / "a", [record(1, "always", True)])
    with pytest.raises(SystemExit) as stopped:
        mur.cli.main(["compare", str(a), str(a), *flags])
    assert stopped.value.code == 2
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert captured.out == "" and len(err) == 1, err
    assert err[0].startswith("mur compare: error: ") and says in err[0], err[0]


# --------------------------------------------------------------------------- traces

T0 = datetime(2026, 11, 27, tzinfo=UTC)


def traced(
    question: int,
    sample: int,
    answer: str,
    momentum: float,
    tokens: int,
    *,
    end: float | None = None,
    latency: float = 100.0,
) -> dict:
    """A recorded trace (gate never) whose one step ends at `momentum`: right when the answer
    is "1"; `end`: seconds after T0 at which it finished (None: no finished_at stamp)."""
    finished_at = None if end is None else (T0 + timedelta(seconds=end)).isoformat()
    run = record(question, "never", answer == "1", backbone=tokens, sample=sample)
    step = {"index": 0, "text": "", "uncertainty": momentum, "momentum_before": 0.0,
            "momentum_after": momentum, "scaled": False, "num_tokens": tokens}  # fmt: skip
    usage = {"backbone_tokens": tokens, "external_tokens": 0}
    trace = {"answer": answer, "finish_reason": "answer", "steps": [step], "usage": usage}
    return {
        **run,
        "answer": answer,
        "latency_s": latency,
        **({"finished_at": finished_at} if finished_at else {}),
        "trace": {**trace, "config": {"gate": "never"}},
    }


# (question, sample, answer, final momentum, tokens); "1" is right. Majority@2 ties go to the
# answer given first (sample 0). AUROC: within a question, is the right trace's momentum lower?
A_TRACES = [
    (1, 0, "1", 0.2, 100), (1, 1, "2", 0.5, 300),  # majority 1; right lower: win
    (2, 0, "1", 0.3, 200), (2, 1, "2", 0.4, 200),  # majority 1; win
    (3, 0, "1", 0.6, 100), (3, 1, "5", 0.4, 300),  # majority 1; loss
]  # fmt: skip
B_TRACES = [
    (1, 0, "2", 0.1, 50), (1, 1, "1", 0.7, 150),  # majority 0; loss
    (2, 0, "1", 0.2, 100), (2, 1, "7", 0.2, 100),  # majority 1; tie: one half
    (3, 0, "1", 0.3, 100), (3, 1, "4", 0.2, 100),  # majority 1; loss
]  # fmt: skip


def traces_pair(tmp_path: Path, others_end: float) -> tuple[Path, Path]:
    """A: samples 0-1 run in [0, 100] s and samples 2-3 (100 tokens each) end at `others_end`;
    B: samples 0-1 in [0, 25] s, and question 4 with sample 0 only, never timed."""
    a = [traced(*t, end=100) for t in A_TRACES] + [
        traced(q, s, "1", 0.1, 100, end=others_end) for q in (1, 2, 3) for s in (2, 3)
    ]
    b = [traced(*t, end=25, latency=25) for t in B_TRACES] + [traced(4, 0, "1", 0.1, 100)]
    return write_records(tmp_path / "a", a), write_records(tmp_path / "b", b)


def test_the_traces_section_equals_the_hand_computed_values(tmp_path: Path) -> None:
    folder_a, folder_b = traces_pair(tmp_path, others_end=150)  # A's others in [50, 150]
    a = first_samples(load_records(folder_a), 2)
    b = first_samples(load_records(folder_b), 2)
    assert b.left_out == ["test/4.json"]
    tc = compare_traces(a, b, resamples=200)
    assert tc is not None
    assert (tc.k, tc.traces, tc.questions, tc.incomplete) == (2, (2, 2), 3, ([], []))
    assert tc.majority == pytest.approx((1.0, 2 / 3))
    assert tc.majority_diff.difference == pytest.approx(-1 / 3)
    assert (tc.majority_diff.better, tc.majority_diff.worse) == (0, 1)
    assert tc.majority_diff.interval == stats.bootstrap_interval([-1.0, 0.0, 0.0], resamples=200)
    assert tc.tokens == pytest.approx((200.0, 100.0)) and tc.tokens_ratio == pytest.approx(0.5)
    auroc_a, auroc_b = tc.auroc
    assert (auroc_a.value, auroc_a.pairs, auroc_a.questions) == (pytest.approx(2 / 3), 3, 3)
    assert (auroc_b.value, auroc_b.pairs, auroc_b.questions) == (pytest.approx(1 / 6), 3, 3)
    assert auroc_a.signal == PRIMARY_SIGNAL
    # A's samples 0-1 ([0, 100]) overlap its samples 2-3 ([50, 150]): the folder's 150 s and
    # 1,200 + 600 tokens, 12 a second; its 1,200 selected tokens take 100 s at that rate.
    time_a, time_b = tc.time
    assert time_a.interleaved and time_a.timing.busy_s == pytest.approx(150)
    assert (time_a.tokens, time_a.rate) == (1800, pytest.approx(12.0))
    # B: 600 tokens in [0, 25]; question 4 (left out, untimed) changes nothing.
    assert not time_b.interleaved and time_b.timing.busy_s == pytest.approx(25)
    assert (time_b.tokens, time_b.rate) == (600, pytest.approx(24.0))
    assert tc.rate_ratio == pytest.approx(2.0)
    text = traces_markdown(tc)
    for line in (
        "## Traces: majority@2, tokens per trace, the final momentum's AUROC, time",
        "| majority@2 accuracy % | 100.0 | 66.7 | -33.3 [",
        "| completion tokens per trace | 200 | 100 | 0.50x |",
        "| within-question AUROC, final momentum (lower) | 0.667 [",
        "], 3 pairs in 3 questions | 0.167 [",
        "| A | 12 of 12 | 2 min 30 s | 1,800 | 12.00 |",
        "| B | 6 of 6 | 0 min 25 s | 600 | 24.00 |",
        "B / A tokens per server-second: 2.00x.",
        "A's 6 selected runs ran interleaved with its 6 runs outside --samples, so its time is "
        "the folder's, compared per token: at its rate their 1,200 tokens take 1 min 40 s.",
    ):
        assert line in text, line
    assert "B's 6 selected runs" not in text


def test_runs_outside_the_samples_that_ran_apart_leave_the_time_to_the_selection(
    tmp_path: Path,
) -> None:
    folder_a, _ = traces_pair(tmp_path, others_end=300)  # A's others in [200, 300]
    time_a = folder_time(first_samples(load_records(folder_a), 2))
    assert not time_a.interleaved
    assert (time_a.timing.busy_s, time_a.tokens, time_a.rate) == (100, 1200, 12.0)


def test_without_samples_majority_is_at_the_fewer_traces_and_incomplete_ones_are_named(
    tmp_path: Path,
) -> None:
    folder_a, folder_b = traces_pair(tmp_path, others_end=150)
    tc = compare_traces(
        first_samples(load_records(folder_a), None),
        first_samples(load_records(folder_b), None),
        resamples=200,
    )
    assert tc is not None
    assert (tc.k, tc.traces, tc.incomplete) == (2, (4, 2), ([], ["test/4.json"]))
    # A's majority@2 averages every 2 of its 4 traces: each question's sample 1 is wrong and
    # wins the tie with a later right one (2 of the 6 pairs), so 4/6 everywhere.
    assert tc.majority[0] == pytest.approx(4 / 6)
    assert "majority@2 of A is averaged over every 2 of its 4 traces" in traces_markdown(tc)


def test_the_cli_writes_the_whole_output_to_out(tmp_path: Path, capsys) -> None:
    folder_a, folder_b = traces_pair(tmp_path, others_end=150)
    out = tmp_path / "compare.md"
    argv = [str(folder_a), str(folder_b), "--samples", "2", "--margin", "-2", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed
    assert printed.index("Samples:") < printed.index("| setting |")
    assert printed.index("non-inferior at -2 points") < printed.index("## Traces: majority@2")
    assert "Served by (`A: " in printed and "Served by (`B: " in printed


def test_real_recorded_traces_relabelled_as_a_candidate(tmp_path: Path, capsys) -> None:
    """Three questions of results/math500-traces-1.5b: A all 8 samples, B its samples 4-7 as
    samples 0-3 (a stand-in for the int8 folder), compared as prereg-int8.md says."""
    real = load_records(Path(__file__).resolve().parents[2] / "results" / "math500-traces-1.5b")
    questions = sorted({r["problem_id"] for r in real})[:3]
    kept = [r for r in real if r["problem_id"] in questions]
    relabelled = [{**r, "sample": r["sample"] - 4} for r in kept if r["sample"] >= 4]
    a, b = write_records(tmp_path / "a", kept), write_records(tmp_path / "b", relabelled)
    assert main([str(a), str(b), "--samples", "4", "--margin", "-2"]) == 0
    printed = capsys.readouterr().out
    assert "A: 12 of 24 runs; questions left out: none." in printed
    assert "| math500 critic never | 3 |" in printed
    assert "non-inferior at -2 points: " in printed
    assert "## Traces: majority@4," in printed and "A's 12 selected runs ran interleaved" in printed
