"""Answer extraction and grading: equivalences, letters, integers, and bounded time.

GPQA rule: no GPQA question or choice text in this file or its output; GPQA checks on the real
data assert on record ids and letters only.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mur.evals.harness.shutdown import StopSignals
from mur.evals.questions import (
    SHIPPED_DATA_DIR,
    DatasetError,
    Problem,
    dataset_file,
    grade,
    grading,
    load_dataset,
)
from mur.evals.questions.grading import (
    extract_answer,
    math_equal,
    parse_aime_int,
    parse_choice_letter,
)
from mur.nodes import answer as answer_module

F = TypeVar("F", bound=Callable[..., Any])


def _bounded(seconds: int) -> Callable[[F], F]:
    """pytest-timeout's mark where that plugin is installed; math_equal's own limit otherwise."""
    if importlib.util.find_spec("pytest_timeout") is not None:
        return pytest.mark.timeout(seconds)
    return lambda test: test


def _problem(dataset: str, answer: str) -> Problem:
    return Problem(
        dataset=dataset, id="t1", question="synthetic", answer=answer, system_prompt=None
    )


@pytest.fixture(scope="module", autouse=True)
def warm_helper() -> None:
    """Start the math-verify helper once, so its start-up is not timed by any test."""
    assert math_equal("1/2", "0.5")


# --------------------------------------------------------------------------- extract_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Step1: 2+2=4. So the answer is 4.", "4"),
        ("The answer is 3 at first. Checking again, the answer is 5.", "5"),
        ("the answer is 1\nStep2: no wait, THE ANSWER IS $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("So the answer is $\\boxed{\\frac{\\sqrt{3}}{2}}$.", "\\frac{\\sqrt{3}}{2}"),
        ("the answer is: **B**", "B"),
        ("the answer is (C).", "(C)"),
        ("the answer is \\(x^2+1\\).", "x^2+1"),
        ("the answer is\n$$\n(1, 2)\n$$\nDone.", "(1, 2)"),
        ("the answer is 3.5. Let me double-check.", "3.5"),
        ("The final answer is $12$.", "12"),
        ("the answer is 42\n\nStep3: unrelated text", "42"),
        ("Thus $x=\\boxed{\\{1, 2\\}}$ and more", "\\{1, 2\\}"),
        ("First \\boxed{1}, then \\boxed{\\frac{a}{b^{2}}}.", "\\frac{a}{b^{2}}"),
        ("\\boxed{\\boxed{7}}", "7"),
        ("done \\boxed{12} and a truncated \\boxed{\\frac{1}{", "12"),
        ("the answer is", None),
        ("the answer is \\boxed{}", None),
        ("No final answer here.", None),
        ("", None),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_answer_is_wins_over_an_earlier_box() -> None:
    assert extract_answer("\\boxed{1} ... so the answer is 2.") == "2"
    assert extract_answer("the answer is \\boxed{3} and later \\boxed{4}") == "3"


def test_one_implementation_shared_with_the_graph() -> None:
    assert grading.extract_answer is answer_module.extract_answer
    tree = ast.parse(Path(answer_module.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "re"}


# --------------------------------------------------------------------------- math_equal

EQUIVALENT = [
    ("0.5", "\\frac{1}{2}"),
    ("1/2", "\\frac{1}{2}"),
    ("0.5", "1/2"),
    ("\\dfrac{1}{2}", "0.5"),
    ("\\tfrac{3}{4}", "0.75"),
    ("3.50", "3.5"),
    ("0.25", "\\frac14"),
    ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("(1, 2, 3)", "\\left(1,2,3\\right)"),
    ("[1, 2)", "[1,2)"),
    ("(-\\infty, 3]", "(-\\infty,3]"),
    ("(-\\infty, -2) \\cup (3, \\infty)", "(-\\infty,-2)\\cup(3,\\infty)"),
    ("\\{1, 2\\}", "\\{2, 1\\}"),
    ("10", "10 \\text{ cm}"),
    ("5\\text{ inches}", "5"),
    ("30", "30^\\circ"),
    ("30^{\\circ}", "30"),
    ("-3", "-3"),
    ("-\\frac{1}{2}", "-0.5"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("\\sqrt{2}/2", "\\frac{\\sqrt2}{2}"),
    ("\\pi/2", "\\frac{\\pi}{2}"),
    ("2x+2", "2(x+1)"),
    ("x=2", "2"),
    ("1,000", "1000"),
    ("\\$18.90", "18.90"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("$\\frac{1}{2}$", "\\frac12"),
]

NOT_EQUIVALENT = [
    ("-3", "3"),
    ("2", "20"),
    ("5", "\\frac{1}{5}"),
    ("\\sqrt{2}", "2"),
    ("x+1", "x-1"),
    ("3.14", "\\pi"),
    ("0.333", "\\frac{1}{3}"),
    ("(1,2]", "[1,2)"),
    ("[1,2]", "(1,2)"),
    ("(1, 2, 3)", "(3, 2, 1)"),
    ("\\infty", "-\\infty"),
    ("A", "B"),
    ("", "5"),
    ("5", ""),
    ("   ", "5"),
]


@pytest.mark.parametrize(("prediction", "gold"), EQUIVALENT)
def test_equivalent(prediction: str, gold: str) -> None:
    assert math_equal(prediction, gold)
    assert math_equal(gold, prediction)


@pytest.mark.parametrize(("prediction", "gold"), NOT_EQUIVALENT)
def test_not_equivalent(prediction: str, gold: str) -> None:
    assert not math_equal(prediction, gold)
    assert not math_equal(gold, prediction)


@pytest.mark.parametrize("value", [None, 5, 0.5, b"1/2", ["1"]])
def test_non_strings_are_not_equal(value: Any) -> None:
    assert math_equal(value, "5") is False
    assert math_equal("5", value) is False


def test_works_from_worker_threads() -> None:
    cases = [*EQUIVALENT[:8], *NOT_EQUIVALENT[:8]]
    expected = [True] * 8 + [False] * 8
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda case: math_equal(*case), cases))
    assert results == expected


PATHOLOGICAL = [
    "10^{10^{10^{10}}}",
    "9^{9^{9}}",
    "9**9**9",
    "1000000!",
    "(" * 400 + "1" + ")" * 400,
    "\\frac{" * 300 + "1" + "}{2}" * 300,
    "9" * 5000,
]


@_bounded(120)
@pytest.mark.parametrize("answer", PATHOLOGICAL, ids=lambda a: a[:12])
def test_pathological_answers_finish(answer: str) -> None:
    assert math_equal(answer, "5", timeout=2) is False
    assert math_equal("5", answer, timeout=2) is False


@_bounded(60)
def test_timeout_kills_and_recovers() -> None:
    # Shorter than math-verify's own 1 s minimum: only the process kill can stop it in time.
    assert math_equal("10^{10^{10^{10}}}", "7", timeout=0.3) is False
    assert math_equal("1/2", "0.5")


# A comparison that runs past its limit is ended by the pool (or by math-verify's own limits,
# whole seconds, inside it); returning takes the kill and the reply, well under a second on an
# idle machine and 2-5 s more on a busy 2-core one where a killed worker is being replaced. The
# bound is a multiple of the limit, not a figure of this machine: the limits are wall-clock
# seconds whatever the CPU, and only the reply's own time grows on a slower one.
LIMITS_WITHIN = 3
# sympy works on these for minutes; only the limit ends them.
ADVERSARIAL = ["10^{10^{10^{10}}}", "9^{9^{9^{9^{9}}}}", "(" * 300 + "1" + ")" * 300]


@_bounded(120)
@pytest.mark.parametrize("answer", ADVERSARIAL, ids=["tower", "tower5", "nested"])
def test_adversarial_answers_are_ended_by_the_limit(
    answer: str, caplog: pytest.LogCaptureFixture
) -> None:
    """README: "graded in bounded time". At 0.5 s the pool's kill ends the comparison
    (math-verify's own limits are whole seconds): no verdict, counted as not equal."""
    assert math_equal("1/2", "0.5")  # a worker is up and idle
    with caplog.at_level("WARNING", logger="mur.evals.questions.grading"):
        assert math_equal(answer, "7", timeout=0.5) is False
    assert "math_equal: no verdict within 0.5 s, counted as not equal" in caplog.text


@_bounded(120)
@pytest.mark.parametrize("answer", ADVERSARIAL, ids=["tower", "tower5", "nested"])
def test_adversarial_answers_return_within_the_limit(answer: str) -> None:
    """Through `grade` as the runner calls it, at the grader's configured limit: whichever of
    the pool's kill and math-verify's own limits comes first ends it, well within a few
    limits (sympy alone would take minutes)."""
    assert math_equal("1/2", "0.5")  # a worker is up and idle: the clock times the comparison
    start = time.monotonic()
    verdict = grade(_problem("math500", "7"), f"the answer is ${answer}$")
    elapsed = time.monotonic() - start
    assert verdict is False
    assert elapsed < LIMITS_WITHIN * grading.DEFAULT_TIMEOUT_S, f"returned after {elapsed:.1f} s"


@_bounded(60)
async def test_a_grading_timeout_is_not_a_stop_signal_to_the_run() -> None:
    """The pool ends a worker that runs over its time with SIGTERM. A worker forked while the
    runner's event loop takes stop signals shares that loop's wakeup socket, and its SIGTERM
    then reached the runner as the runner's own: a phantom stop, and with a second one every
    question in flight cancelled (seen: `pkill -f run.py` matched the workers too)."""
    verifier, stops = grading._Verifier(1), []
    loop = asyncio.get_running_loop()
    try:
        with StopSignals(on_first=stops.append, on_second=stops.append):
            assert await loop.run_in_executor(None, verifier.equal, "1/2", "0.5", 60)
            slow = ("10^{10^{10^{10}}}", "7", 0.3)  # only the kill stops it in time
            assert not await loop.run_in_executor(None, verifier.equal, *slow)
            await asyncio.sleep(0.5)  # for a signal on its way to be handled
    finally:
        verifier.close()
    assert stops == []


def test_grading_from_a_script_without_a_main_guard(tmp_path: Path) -> None:
    # Workers must not run the caller's main module again (spawn / fork-server workers do).
    script = tmp_path / "grade_it.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(Path(grading.__file__).resolve().parents[2])!r})\n"
        "from mur.evals.questions.grading import math_equal\n"
        "print('verdict', math_equal('\\\\frac{1}{2}', '0.5'))\n"
    )
    # The previous test's timeout had its worker killed, and the pool forks a replacement from
    # a thread of its own. A worker forked while subprocess.run starts the script inherits
    # run's exec-status pipe and run then waits for that worker to exit: stop the pool first.
    grading._VERIFIER.close()
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["verdict True"]


def test_overlong_answers_compare_as_strings_only() -> None:
    long = "1+" * grading.MAX_ANSWER_CHARS + "1"
    assert math_equal(long, long)
    assert not math_equal(long, str(grading.MAX_ANSWER_CHARS + 1))


# --------------------------------------------------------------------------- fuzzing

LATEXISH = st.lists(
    st.sampled_from(
        [
            *"0123456789+-*/^_{}()[]$.,=! xyz\\",
            "\\frac",
            "\\boxed{",
            "\\sqrt",
            "\\left(",
            "\\right)",
            "^{",
            "\\infty",
            "\\pi",
            "\\text{",
            "the answer is ",
            "\\\\",
            "\n",
        ]
    ),
    max_size=60,
).map("".join)


@settings(max_examples=300)
@given(st.one_of(st.text(max_size=2000), LATEXISH))
def test_extract_answer_never_raises(text: str) -> None:
    result = extract_answer(text)
    assert result is None or (isinstance(result, str) and result)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=300), LATEXISH), st.one_of(st.text(max_size=50), LATEXISH))
def test_math_equal_never_raises(prediction: str, gold: str) -> None:
    assert math_equal(prediction, gold, timeout=2) in (True, False)


@settings(max_examples=200)
@given(st.text(max_size=500))
def test_letter_and_integer_parsers_never_raise(text: str) -> None:
    assert parse_choice_letter(text) in (None, "A", "B", "C", "D")
    value = parse_aime_int(text)
    assert value is None or isinstance(value, int)


# --------------------------------------------------------------------------- grade


@pytest.mark.parametrize(
    ("prediction", "correct"),
    [
        ("25", True),
        ("025", True),
        ("\\boxed{25}", True),
        ("25.", True),
        ("$25$", True),
        ("25.0", True),
        ("\\text{25}", True),
        ("So the answer is \\boxed{025}.", True),
        ("26", False),
        ("25.5", False),
        ("\\frac{50}{2}", False),
        ("x", False),
        ("", False),
        (None, False),
    ],
)
def test_grade_aime(prediction: str | None, correct: bool) -> None:
    assert grade(_problem("aime24", "25"), prediction) is correct
    assert grade(_problem("aime25", "25"), prediction) is correct


def test_parse_aime_int() -> None:
    assert parse_aime_int("007") == 7
    assert parse_aime_int("{ 204 }") == 204
    assert parse_aime_int("1e3") is None
    assert parse_aime_int("9" * 5000) is None


@pytest.mark.parametrize(
    ("prediction", "correct"),
    [
        ("B", True),
        ("b", True),
        ("(B)", True),
        ("B)", True),
        ("\\boxed{B}", True),
        ("\\text{B}", True),
        ("**B**", True),
        ("B. Some choice text", True),
        ("The answer is (B).", True),
        ("Option B", True),
        ("a choice like B", True),
        ("A", False),
        ("(C)", False),
        ("D. Some choice text", False),
        ("", False),
        ("none of them", False),
        (None, False),
    ],
)
def test_grade_gpqa_letters(prediction: str | None, correct: bool) -> None:
    assert grade(_problem("gpqa_diamond", "B"), prediction) is correct


@pytest.mark.parametrize(
    ("prediction", "correct"),
    [
        ("\\frac{1}{2}", True),
        ("0.5", True),
        ("Step1: halve it.\nSo the answer is $\\boxed{\\dfrac12}$.", True),
        ("\\frac{1}{3}", False),
        (None, False),
    ],
)
def test_grade_math(prediction: str | None, correct: bool) -> None:
    assert grade(_problem("math500", "\\frac{1}{2}"), prediction) is correct


def test_grade_unknown_dataset() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'gsm8k': choose one of math500"):
        grade(_problem("gsm8k", "1"), "1")


# --------------------------------------------------------------------------- real data

# MATH-500 and AIME ship in evals/questions/data; GPQA never does and is looked for where the
# loader would.


def _gpqa_or_skip() -> None:
    try:
        dataset_file("gpqa_diamond")
    except DatasetError as exc:
        pytest.skip(f"GPQA-diamond not available: {exc}")


def test_math500_reference_solutions_grade_correct() -> None:
    solutions = {}
    for line in (SHIPPED_DATA_DIR / "math500.jsonl").read_text().splitlines():
        record = json.loads(line)
        solutions[record["unique_id"]] = record["solution"]
    wrong = [p.id for p in load_dataset("math500") if not grade(p, solutions[p.id])]
    assert wrong == []


def test_math500_gold_answers_verify_against_themselves() -> None:
    # Through math-verify itself (no string shortcut): every gold answer must parse.
    problems = load_dataset("math500", limit=100)
    failed = [p.id for p in problems if not grading._VERIFIER.equal(p.answer, p.answer, 10)]
    assert failed == []


def test_gpqa_letters_grade_on_real_problems() -> None:
    _gpqa_or_skip()
    problems = load_dataset("gpqa_diamond")
    wrong = [p.id for p in problems if not grade(p, f"the answer is ({p.answer})")]
    other = {"A": "B", "B": "C", "C": "D", "D": "A"}
    lenient = [p.id for p in problems if grade(p, other[p.answer])]
    assert wrong == [] and lenient == []


def test_aime_gold_answers_grade_correct() -> None:
    for name in ("aime24", "aime25"):
        wrong = [p.id for p in load_dataset(name) if not grade(p, f"\\boxed{{{p.answer}}}")]
        assert wrong == []
