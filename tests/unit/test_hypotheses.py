"""H1-H3 per strategy and pooled: numbers a reader can recompute by hand, and the rules that
decide them (results/prereg-small-backbone-external-judge.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_report import record, write_records

from mur.cli.report import main as report_main
from mur.experiments import small_backbone as hypotheses


def strategy_records(strategy: str, questions: int, correct: dict[str, set[int]]) -> list[dict]:
    """never/always/mur/random@0.25 on `questions`; `correct[gate]` the questions it solves.
    MUR scales 1 of 4 eligible steps (3 of 4 are eligible: step 1 never is), so its rate is
    1/3; the random run's label sits at that rate."""
    gates = {
        "never": dict(backbone=100, scaled=0, latency=1.0),
        "always": dict(backbone=100, external=300, scaled=4, latency=4.0),
        "mur": dict(backbone=100, external=50, scaled=1, latency=1.5, gamma=0.9),
        "random@0.333": dict(backbone=100, external=60, scaled=1, latency=1.6),
    }
    out = []
    for gate, numbers in gates.items():
        for q in range(questions):
            r = record(q, gate, q in correct[gate], steps=4, **numbers)
            out.append({**r, "strategy": strategy, "key": r["key"].replace("critic", strategy)})
    return out


def test_per_strategy_and_pooled_tests_by_hand() -> None:
    critic = strategy_records(
        "critic",
        10,
        {
            "never": {0, 1},
            "always": {0, 1, 2, 3, 4, 5},
            "mur": {0, 1, 2, 3, 4},
            "random@0.333": {0},
        },
    )
    best = strategy_records(
        "best_of_n",
        10,
        {"never": {0}, "always": {0, 1, 2}, "mur": {0, 1, 2}, "random@0.333": {0, 1}},
    )
    tests = hypotheses.hypothesis_tests(critic + best, resamples=2000)
    by = {(d.name, d.claim.rpartition(", ")[2]): d for d in tests}
    h1_critic = by[("H1", "critic")]
    assert h1_critic.detail.startswith("10 pairs, better / worse 4 / 0, ")
    assert h1_critic.value == pytest.approx(0.4)
    pooled = by[("H1", hypotheses.POOLED)]
    assert pooled.detail.startswith(f"20 pairs, better / worse 6 / 0, exact p {2 * 0.5**6:.3g};")
    assert pooled.value == pytest.approx(0.3)
    assert pooled.interval is not None and pooled.interval.low > 0 and pooled.supported
    # H2: 150 / 400 tokens, and MUR loses one question of the critic: -0.05 pooled.
    h2 = by[("H2", hypotheses.POOLED)]
    assert h2.detail.endswith(f"{150 / 400:.2f}x the tokens, {1.5 / 4:.2f}x the wall time")
    assert h2.value == pytest.approx(-0.05)
    assert h2.supported == (h2.interval.low > hypotheses.ECONOMY_MARGIN)
    # H3: MUR solves 5 more than random (4 critic + 1 best_of_n), none fewer: p = 2 / 2^5.
    h3 = by[("H3", hypotheses.POOLED)]
    assert f"better / worse 5 / 0, exact p {2 * 0.5**5:.3g};" in h3.detail
    assert not h3.supported  # 5 better, 0 worse is p = 0.0625: not below 0.05
    cost = by[(hypotheses.COST, "critic")]
    assert cost.supported is None and not cost.tested


def test_h3_needs_the_exact_test_below_alpha() -> None:
    """Six better and none worse is p = 2 / 2^6 = 0.031: selection holds; one better is not."""
    six = strategy_records(
        "critic", 10, {"never": set(), "always": set(), "mur": set(range(6)), "random@0.333": set()}
    )
    one = strategy_records(
        "critic", 10, {"never": set(), "always": {0, 1}, "mur": {0, 1}, "random@0.333": {0}}
    )
    for records, expected in ((six, (6, 0, True)), (one, (1, 0, False))):
        [h3] = [d for d in hypotheses.hypothesis_tests(records, resamples=500) if d.name == "H3"]
        better, worse, supported = expected
        assert f"better / worse {better} / {worse}," in h3.detail and h3.supported is supported


def test_cluster_interval_resamples_questions_not_pairs() -> None:
    # One question with two +1 pairs, one with two -1 pairs: the interval spans both ends.
    interval = hypotheses.cluster_interval([[1.0, 1.0], [-1.0, -1.0]], resamples=4000)
    assert interval is not None and interval.low == -1.0 and interval.high == 1.0
    assert hypotheses.cluster_interval([[1.0]]) is None


def test_report_combines_folders_and_states_the_hypotheses(tmp_path: Path) -> None:
    critic = strategy_records(
        "critic", 6, {"never": {0}, "always": {0, 1, 2}, "mur": {0, 1}, "random@0.333": {0}}
    )
    best = strategy_records(
        "best_of_n", 6, {"never": {0}, "always": {0, 1}, "mur": {0, 1}, "random@0.333": set()}
    )
    first = write_records(tmp_path / "critic", critic)
    second = write_records(tmp_path / "best_of_n", best)
    out = tmp_path / "combined"
    assert report_main([str(first), str(second), "--out", str(out), "--resamples", "200"]) == 0
    markdown = (out / "report.md").read_text()
    assert "Hypotheses of `results/prereg-small-backbone-external-judge.md`:" in markdown
    assert "| H1: scaling pays: always - never, pooled | " in markdown
    assert "12 pairs, better / worse" in markdown
    assert (out / "accuracy_vs_tokens.png").exists()
    document = json.loads((out / "report.json").read_text())
    scopes = {d["claim"].rpartition(", ")[2] for d in document["hypotheses"]}
    assert scopes == {"critic", "best_of_n", "pooled"}


def test_several_folders_need_out(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        report_main(["a", "b"])
    assert exited.value.code == 2
    assert "--out" in capsys.readouterr().err


def test_an_experiment_named_for_records_it_does_not_read_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    critic = strategy_records(
        "critic", 4, {"never": {0}, "always": {0, 1}, "mur": {0}, "random@0.333": set()}
    )
    folder = write_records(tmp_path / "critic", critic)
    assert report_main([str(folder), "--prereg", "parallel-traces", "--resamples", "50"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "mur report: parallel-traces (results/prereg-parallel-traces.md) decides on a folder of "
        "one setting's traces; these records are one run folder without traces"
    ]
    assert report_main([str(folder), "--resamples", "50"]) == 0  # no experiment: plain tables
    assert "hypotheses" not in json.loads((folder / "report.json").read_text())


def test_an_unknown_experiment_is_the_registrys_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        report_main(["somewhere", "--prereg", "nope"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        "argument --prereg: unknown experiment 'nope': choose one of "
        "small-backbone-external-judge, parallel-traces, branching-fresh, cascade, bfcl; see "
        "--help"
    )
