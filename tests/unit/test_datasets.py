"""Benchmark loaders, on the shipped copies, GPQA where it is found, and small broken files.

GPQA rule: no GPQA question or choice text may appear in this file or in any test output, so
every GPQA check below compares inside the test and asserts on booleans, letters or record ids.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pickle
import subprocess
import sys
import types
from pathlib import Path

import pytest

from mur.cli.solve import build_parser as solve_parser
from mur.evals.questions import (
    DATASETS,
    PUBLIC_DATASETS,
    REGISTRY,
    DataNotFoundError,
    Dataset,
    DatasetError,
    HubSplit,
    MalformedRecordError,
    Parsed,
    Problem,
    dataset_file,
    grade,
    load_dataset,
    math_equal,
    resolve_data_dir,
)
from mur.evals.questions import loading as ds

PROJECT_ROOT = Path(__file__).resolve().parents[2]
AIME_SYSTEM = "You are a helpful math assistant."
GPQA_SYSTEM = 'You are a helpful assistant. Please answer "A", "B", "C", or "D".'


# What the shipped copies must be: byte-identical to their upstream files
# (evals/questions/data/README.md).
SHIPPED = {
    "math500.jsonl": ("35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132", 500),
    "aime24.jsonl": ("af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac", 30),
    "aime25.jsonl": ("b4e273c02d3e7fe1b74b59eae768fc8230bfb0f79539890cb56f4361caac0331", 30),
}


@pytest.fixture(scope="module")
def data_dir() -> Path:
    """The public benchmarks, shipped inside the project: present in every clone."""
    return ds.SHIPPED_DATA_DIR


@pytest.fixture(scope="module")
def gpqa_dir() -> Path:
    """The folder holding GPQA-diamond, which is never shipped; skips saying where to put it."""
    try:
        return dataset_file("gpqa_diamond").parent
    except DatasetError as exc:
        pytest.skip(f"GPQA-diamond not available: {exc}")


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _math_record(i: int, answer: str = "1") -> str:
    return json.dumps({"problem": f"What is {i}?", "answer": answer, "unique_id": f"t/{i}.json"})


def _fake_gpqa_record(record_id: str = "recFAKE1", **overrides: str) -> dict[str, str]:
    # Synthetic placeholder text, not GPQA content.
    record = {
        "Record ID": record_id,
        "Question": "Synthetic placeholder question?",
        "Correct Answer": "right",
        "Incorrect Answer 1": "wrong one",
        "Incorrect Answer 2": "wrong two",
        "Incorrect Answer 3": "wrong three",
        "High-level domain": "Physics",
        "Subdomain": "Synthetic",
    }
    record.update(overrides)
    return record


# --------------------------------------------------------------------------- real files


def _check_counts_and_fields(problems: list[Problem], name: str, count: int) -> None:
    assert len(problems) == count
    assert all(isinstance(p, Problem) and p.dataset == name for p in problems)
    assert len({p.id for p in problems}) == count
    assert all(p.question.strip() and p.answer for p in problems)
    assert {p.system_prompt for p in problems} == {REGISTRY[name].system_prompt}


@pytest.mark.parametrize(("name", "count"), [("math500", 500), ("aime24", 30), ("aime25", 30)])
def test_counts_and_fields(data_dir: Path, name: str, count: int) -> None:
    _check_counts_and_fields(load_dataset(name, data_dir), name, count)


def test_gpqa_counts_and_fields(gpqa_dir: Path) -> None:
    _check_counts_and_fields(load_dataset("gpqa_diamond", gpqa_dir), "gpqa_diamond", 198)


@pytest.mark.parametrize("file_name", SHIPPED)
def test_shipped_copies_match_their_pinned_hash_and_count(file_name: str) -> None:
    raw = (ds.SHIPPED_DATA_DIR / file_name).read_bytes()
    digest, count = SHIPPED[file_name]
    assert hashlib.sha256(raw).hexdigest() == digest
    assert raw.count(b"\n") == count and raw.endswith(b"\n")
    readme = (ds.SHIPPED_DATA_DIR / "README.md").read_text()
    assert digest in readme and f"`{file_name}` | {count} |" in readme


def test_gpqa_is_never_in_the_repository() -> None:
    """Its authors ask that it never appear in plain text online, nor compressed here."""
    files = subprocess.run(
        ["git", "ls-files"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=False
    )
    if files.returncode != 0:
        pytest.skip(f"not a git checkout ({files.stderr.strip()[:200]})")
    tracked = files.stdout.splitlines()
    assert tracked, "git ls-files listed nothing"
    assert [f for f in tracked if "gpqa" in Path(f).name.lower()] == []
    assert not any((ds.SHIPPED_DATA_DIR / name).exists() for name in REGISTRY["gpqa_diamond"].files)


def test_system_prompts_follow_the_contract() -> None:
    assert {name: entry.system_prompt for name, entry in REGISTRY.entries.items()} == {
        "math500": None,
        "aime24": AIME_SYSTEM,
        "aime25": AIME_SYSTEM,
        "gpqa_diamond": GPQA_SYSTEM,
    }
    assert DATASETS == ("math500", "aime24", "aime25", "gpqa_diamond")


def test_public_sets_default_to_the_shipped_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fresh clone: no data folder given, nothing beside the project.
    monkeypatch.delenv(ds.DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(ds, "_SHARED_DATA_DIR", tmp_path / "absent")
    assert resolve_data_dir() == ds.SHIPPED_DATA_DIR
    for name in PUBLIC_DATASETS:
        assert resolve_data_dir(name=name) == ds.SHIPPED_DATA_DIR
    assert len(load_dataset("aime25")) == 30
    assert dataset_file("math500") == ds.SHIPPED_DATA_DIR / "math500.jsonl"


def test_gpqa_defaults_to_shared_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ds.DATA_DIR_ENV, raising=False)
    shared = tmp_path / "shared" / "data"
    shared.mkdir(parents=True)
    with gzip.open(shared / "gpqa_diamond.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write(json.dumps(_fake_gpqa_record("recS")) + "\n")
    monkeypatch.setattr(ds, "_SHARED_DATA_DIR", shared)
    assert resolve_data_dir(name="gpqa_diamond") == shared
    assert [p.id for p in load_dataset("gpqa_diamond")] == ["recS"]
    # The public sets still come from the shipped copies, not from that folder.
    assert len(load_dataset("math500", limit=2)) == 2


def test_absent_gpqa_says_why_and_where_to_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ds.DATA_DIR_ENV, raising=False)
    absent = tmp_path / "absent"
    monkeypatch.setattr(ds, "_SHARED_DATA_DIR", absent)
    for call in (lambda: load_dataset("gpqa_diamond"), lambda: dataset_file("gpqa_diamond")):
        with pytest.raises(DataNotFoundError) as info:
            call()
        message = str(info.value)
        assert "not shipped" in message and str(absent) in message
        assert "--data-dir" in message and "MUR_DATA_DIR" in message and "hf" in message
    # A shared folder without the file: the same explanation, naming the file looked for.
    absent.mkdir()
    with pytest.raises(DataNotFoundError, match="not shipped") as info:
        load_dataset("gpqa_diamond")
    assert str(absent / "gpqa_diamond.jsonl.gz") in str(info.value)


def test_dataset_file_from_the_hub_is_not_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ds.DATA_DIR_ENV, "hf")
    with pytest.raises(DatasetError, match="Hugging Face hub"):
        dataset_file("math500")


def test_math500_keeps_answer_and_metadata(data_dir: Path) -> None:
    first = load_dataset("math500", data_dir, limit=1)[0]
    assert first.id == "test/precalculus/807.json"
    assert first.answer == r"\left( 3, \frac{\pi}{2} \right)"
    assert first.metadata == {"subject": "Precalculus", "level": 2}
    assert first.system_prompt is None


def test_aime_answers_are_plain_integers(data_dir: Path) -> None:
    raw = [json.loads(line) for line in (data_dir / "aime24.jsonl").read_text().splitlines()]
    padded = {str(r["id"]): r["answer"] for r in raw if r["answer"].startswith("0")}
    assert padded, "the AIME24 copy should contain zero-padded answers such as '025'"
    by_id = {p.id: p for p in load_dataset("aime24", data_dir)}
    for problem_id, answer in padded.items():
        assert by_id[problem_id].answer == str(int(answer))
    for name in ("aime24", "aime25"):
        for p in load_dataset(name, data_dir):
            assert p.answer == str(int(p.answer)) and 0 <= int(p.answer) <= 999


def test_aime_metadata(data_dir: Path) -> None:
    aime24 = load_dataset("aime24", data_dir)
    assert {p.metadata["contest"] for p in aime24} == {"I", "II"}
    aime25 = load_dataset("aime25", data_dir)
    assert [p.metadata["contest"] for p in aime25] == ["I"] * 15 + ["II"] * 15
    assert [p.metadata["number"] for p in aime25] == list(range(1, 16)) * 2


def _raw_gpqa_correct(gpqa_dir: Path) -> dict[str, str]:
    with gzip.open(gpqa_dir / "gpqa_diamond.jsonl.gz", "rt", encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    return {r["Record ID"]: r["Correct Answer"].strip() for r in records}


def test_gpqa_correct_letter_maps_to_correct_answer(gpqa_dir: Path) -> None:
    correct = _raw_gpqa_correct(gpqa_dir)
    problems = load_dataset("gpqa_diamond", gpqa_dir)
    mismatched = [
        p.id
        for p in problems
        if p.metadata["choices"].get(p.answer) != correct[p.id]
        or p.metadata["correct_letter"] != p.answer
        or p.answer not in "ABCD"
    ]
    assert mismatched == []


def test_gpqa_question_lists_the_four_lettered_choices(gpqa_dir: Path) -> None:
    bad = []
    for p in load_dataset("gpqa_diamond", gpqa_dir):
        choices = p.metadata["choices"]
        tail = "\n".join(f"{letter}) {choices[letter]}" for letter in "ABCD")
        if list(choices) != list("ABCD") or not p.question.endswith("\n\n" + tail):
            bad.append(p.id)
    assert bad == []


# The shuffle, its pin and the privacy checks need no real GPQA text: a question's order comes
# from its Record ID alone, so synthetic records pin it on every clone.
SYNTHETIC_IDS = [f"recSYN{i:03d}" for i in range(100)]
SYNTHETIC_LETTERS = (
    "CCDBBCDCADACCDBBADBDCACBBBAADACADCBADCACBABDABCAAACBDBBACBCDDBCBCABBDCBDDCCDCDADBABADBAD"
    "AADDBCCBCCAD"
)
SYNTHETIC_OPTIONS = (
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
)


def _synthetic_gpqa_record(record_id: str) -> dict[str, str]:
    """A made-up GPQA-format record whose options say which source field they came from."""
    return _fake_gpqa_record(
        record_id,
        **{"Question": f"Synthetic question {record_id}?"},
        **{field: f"{field} of {record_id}" for field in SYNTHETIC_OPTIONS},
    )


@pytest.fixture
def synthetic_gpqa(tmp_path: Path) -> Path:
    """A data folder holding a synthetic gpqa_diamond.jsonl.gz of 100 records."""
    with gzip.open(tmp_path / "gpqa_diamond.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(_synthetic_gpqa_record(r)) + "\n" for r in SYNTHETIC_IDS)
    return tmp_path


def test_gpqa_shuffle_is_pinned_stable_and_balanced(synthetic_gpqa: Path) -> None:
    first = load_dataset("gpqa_diamond", synthetic_gpqa)
    second = load_dataset("gpqa_diamond", synthetic_gpqa)
    assert [p.question for p in first] == [p.question for p in second]
    letters = "".join(p.answer for p in first)
    # Pinned: a change of the shuffle would silently change every GPQA result.
    assert letters == SYNTHETIC_LETTERS
    assert all(20 <= letters.count(letter) <= 30 for letter in "ABCD")
    # The whole order, not only where the correct answer went (source option under A..D).
    sources = [
        [SYNTHETIC_OPTIONS.index(p.metadata["choices"][x].split(" of ")[0]) for x in "ABCD"]
        for p in first[:4]
    ]
    assert sources == [[3, 2, 0, 1], [2, 1, 0, 3], [1, 3, 2, 0], [3, 0, 2, 1]]
    for p in first:
        assert p.metadata["choices"][p.answer] == f"Correct Answer of {p.id}"


def test_gpqa_shuffle_is_stable_across_python_processes(synthetic_gpqa: Path) -> None:
    code = (
        "from evals.questions import load_dataset; import sys; "
        "print(''.join(p.answer for p in load_dataset('gpqa_diamond', sys.argv[1])))"
    )
    for hash_seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(PROJECT_ROOT)}
        out = subprocess.run(
            [sys.executable, "-c", code, str(synthetic_gpqa)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            timeout=120,
        )
        assert out.stdout.strip() == SYNTHETIC_LETTERS


def test_repr_never_shows_question_text(synthetic_gpqa: Path) -> None:
    """Logs and tracebacks show problems by repr: GPQA's text must never appear there."""
    for problem in load_dataset("gpqa_diamond", synthetic_gpqa, limit=3):
        shown = f"{problem!r} {problem!s} {[problem]!r}"
        assert problem.question not in shown and "Synthetic question" not in shown
        assert not any(choice in shown for choice in problem.metadata["choices"].values())
        assert problem.id in shown


def test_gpqa_shuffle_of_the_real_set_is_pinned_and_balanced(gpqa_dir: Path) -> None:
    letters = "".join(p.answer for p in load_dataset("gpqa_diamond", gpqa_dir))
    assert letters[:12] == "ADABADCDBDAD"
    assert all(30 <= letters.count(letter) <= 70 for letter in "ABCD")


def test_limit(data_dir: Path) -> None:
    assert [p.id for p in load_dataset("math500", data_dir, limit=3)] == [
        p.id for p in load_dataset("math500", data_dir)[:3]
    ]
    assert load_dataset("aime24", data_dir, limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        load_dataset("math500", data_dir, limit=-1)


def test_offset_skips_the_first_questions_in_file_order(data_dir: Path) -> None:
    every = [p.id for p in load_dataset("math500", data_dir)]
    assert [p.id for p in load_dataset("math500", data_dir, offset=200, limit=3)] == every[200:203]
    assert [p.id for p in load_dataset("math500", data_dir, offset=498)] == every[498:]
    past = "offset 500 skips every question of math500, which has 500"
    with pytest.raises(ValueError, match=past):
        load_dataset("math500", data_dir, offset=500)
    with pytest.raises(ValueError, match="offset"):
        load_dataset("math500", data_dir, offset=-1)


def test_name_is_case_insensitive(data_dir: Path) -> None:
    assert len(load_dataset("AIME25", data_dir)) == 30


# --------------------------------------------------------------------------- errors


def test_unknown_dataset_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'gsm8k'") as info:
        load_dataset("gsm8k")
    assert all(name in str(info.value) for name in DATASETS)


def test_missing_data_dir_names_path_and_options(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(DataNotFoundError) as info:
        load_dataset("math500", missing)
    message = str(info.value)
    assert str(missing) in message and "--data-dir" in message and "MUR_DATA_DIR" in message
    assert isinstance(info.value, FileNotFoundError)


def test_missing_dir_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ds.DATA_DIR_ENV, str(tmp_path / "gone"))
    with pytest.raises(DataNotFoundError, match=r"\$MUR_DATA_DIR"):
        load_dataset("aime24")


def test_explicit_dir_is_used_for_every_benchmark(tmp_path: Path) -> None:
    # No silent fallback to the shipped copy: an explicit folder must hold the file.
    with pytest.raises(DataNotFoundError, match="shipped") as info:
        load_dataset("math500", tmp_path)
    assert str(tmp_path / "math500.jsonl") in str(info.value)


def test_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError) as info:
        load_dataset("aime25", tmp_path)
    assert str(tmp_path / "aime25.jsonl") in str(info.value)
    assert "MUR_DATA_DIR" in str(info.value)


def test_argument_beats_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = tmp_path / "good"
    good.mkdir()
    _write_jsonl(good / "math500.jsonl", [_math_record(1), _math_record(2)])
    monkeypatch.setenv(ds.DATA_DIR_ENV, str(tmp_path / "gone"))
    assert [p.id for p in load_dataset("math500", good)] == ["t/1.json", "t/2.json"]
    monkeypatch.setenv(ds.DATA_DIR_ENV, str(good))
    assert len(load_dataset("math500")) == 2


def test_bad_json_names_file_and_line(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "math500.jsonl", [_math_record(1), "", '{"problem": "x",'])
    with pytest.raises(MalformedRecordError) as info:
        load_dataset("math500", tmp_path)
    assert str(path) in str(info.value) and "line 3" in str(info.value)
    assert "invalid JSON" in str(info.value)
    assert (info.value.source, info.value.line) == (str(path), 3)
    assert isinstance(info.value, ValueError)


def test_missing_field_names_file_line_and_field(tmp_path: Path) -> None:
    lines = [_math_record(1), json.dumps({"problem": "x", "unique_id": "t/2.json"})]
    path = _write_jsonl(tmp_path / "math500.jsonl", lines)
    with pytest.raises(MalformedRecordError, match=r"line 2: missing field 'answer'") as info:
        load_dataset("math500", tmp_path)
    assert str(path) in str(info.value)


def test_non_object_and_non_utf8_lines(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "math500.jsonl", ["[1, 2]"])
    with pytest.raises(MalformedRecordError, match="line 1: expected a JSON object"):
        load_dataset("math500", tmp_path)
    (tmp_path / "math500.jsonl").write_bytes(_math_record(1).encode() + b"\n\xff\xfe\n")
    with pytest.raises(MalformedRecordError, match="line 2: not UTF-8"):
        load_dataset("math500", tmp_path)


def test_aime_non_integer_answer_is_malformed(tmp_path: Path) -> None:
    record = {"problem": "p", "answer": "2.5", "id": "0"}
    _write_jsonl(tmp_path / "aime25.jsonl", [json.dumps(record)])
    with pytest.raises(MalformedRecordError, match="line 1: field 'answer' must be an integer"):
        load_dataset("aime25", tmp_path)


def test_duplicate_id_is_malformed(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "math500.jsonl", [_math_record(1), _math_record(1)])
    with pytest.raises(MalformedRecordError, match="line 2: duplicate id"):
        load_dataset("math500", tmp_path)


def test_gzipped_gpqa_missing_field(tmp_path: Path) -> None:
    good = json.dumps(_fake_gpqa_record("recA"))
    bad_record = _fake_gpqa_record("recB")
    del bad_record["Incorrect Answer 2"]
    path = tmp_path / "gpqa_diamond.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(good + "\n" + json.dumps(bad_record) + "\n")
    with pytest.raises(MalformedRecordError, match="line 2: missing field 'Incorrect Answer 2'"):
        load_dataset("gpqa_diamond", tmp_path)


def test_corrupt_gzip_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "gpqa_diamond.jsonl.gz"
    path.write_bytes(b"this is not gzip data\n")
    with pytest.raises(DataNotFoundError, match="cannot read") as info:
        load_dataset("gpqa_diamond", tmp_path)
    assert str(path) in str(info.value)


def test_synthetic_gpqa_letters_and_choices(tmp_path: Path) -> None:
    path = tmp_path / "gpqa_diamond.jsonl.gz"
    records = [_fake_gpqa_record(f"rec{i}") for i in range(40)]
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)
    problems = load_dataset("gpqa_diamond", tmp_path)
    assert all(p.metadata["choices"][p.answer] == "right" for p in problems)
    assert len({p.answer for p in problems}) == 4  # the correct choice moves around
    first = problems[0]
    assert first.question.startswith("Synthetic placeholder question?\n\nA) ")
    assert sorted(first.metadata["choices"].values()) == sorted(
        ["right", "wrong one", "wrong two", "wrong three"]
    )
    assert first.metadata["domain"] == "Physics" and first.metadata["record_id"] == "rec0"
    assert pickle.loads(pickle.dumps(first)) == first  # checkpointers may store problems
    assert hash(first) == hash(load_dataset("gpqa_diamond", tmp_path, limit=1)[0])


# --------------------------------------------------------------------------- hub path


def _fake_hub(monkeypatch: pytest.MonkeyPatch, rows: dict[tuple[str, str | None], list]) -> list:
    calls: list = []

    def load(repo: str, config: str | None = None, *, split: str) -> list:
        calls.append((repo, config, split))
        return rows[(repo, config)]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load))
    return calls


def test_hub_math500_and_aime25(monkeypatch: pytest.MonkeyPatch) -> None:
    math_rows = [json.loads(_math_record(i, answer=r"\frac12")) for i in range(3)]
    aime_i = [{"question": f"q{i}", "answer": str(i)} for i in range(15)]
    aime_ii = [{"question": f"q{i}", "answer": "007"} for i in range(15, 30)]
    calls = _fake_hub(
        monkeypatch,
        {
            ("HuggingFaceH4/MATH-500", None): math_rows,
            ("opencompass/AIME2025", "AIME2025-I"): aime_i,
            ("opencompass/AIME2025", "AIME2025-II"): aime_ii,
        },
    )
    math = load_dataset("math500", "hf", limit=2)
    assert [p.answer for p in math] == [r"\frac12"] * 2
    aime = load_dataset("aime25", "HF")
    assert [p.id for p in aime] == [str(i) for i in range(30)]
    assert aime[20].answer == "7" and aime[20].metadata["contest"] == "II"
    assert ("HuggingFaceH4/MATH-500", None, "test") in calls


def test_hub_without_datasets_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DatasetError, match="pip install datasets"):
        load_dataset("aime24", "hf")


def test_hub_failure_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: object, **kwargs: object) -> list:
        raise ConnectionError("offline")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    monkeypatch.setenv(ds.DATA_DIR_ENV, "hf")
    with pytest.raises(DatasetError, match="Idavidrein/gpqa") as info:
        load_dataset("gpqa_diamond")
    assert "--data-dir" in str(info.value)


# --------------------------------------------------------------------------- the registry


def test_every_entry_is_whole_and_only_public_sets_ship() -> None:
    assert set(REGISTRY) == set(DATASETS) and {"gpqa_diamond"} == set(DATASETS) - set(
        PUBLIC_DATASETS
    )
    for name, entry in REGISTRY.entries.items():
        assert entry.name == name and entry.title and entry.files and entry.hub
        shipped = [(ds.SHIPPED_DATA_DIR / file).exists() for file in entry.files]
        assert any(shipped) if entry.public else not any(shipped)
        assert entry.public or entry.access  # a set that is not shipped says how to get it


def test_mur_solve_names_every_dataset_in_its_help() -> None:
    action = next(a for a in solve_parser()._actions if a.dest == "dataset")
    assert all(f"{entry.name} ({entry.title})" in action.help for entry in REGISTRY.values())


def test_a_dataset_is_one_registry_entry_plus_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GSM8K-style data (its answer after '####'): one entry and its file; loading, the system
    prompt and grading all follow from the entry."""
    record = {"question": "What is 48 + 24?", "answer": "48 + 24 = 72\n#### 72"}
    _write_jsonl(tmp_path / "gsm8k.jsonl", [json.dumps(record)])
    gsm8k = Dataset(
        name="gsm8k",
        title="GSM8K",
        files=("gsm8k.jsonl",),
        hub=(HubSplit("openai/gsm8k", "main", "test"),),
        system_prompt=None,
        parse=lambda fields, index: Parsed(
            id=str(index),
            question=fields.text("question"),
            answer=fields.text("answer").rpartition("####")[2].strip(),
        ),
        grade=math_equal,
    )
    monkeypatch.setitem(REGISTRY.entries, "gsm8k", gsm8k)
    [problem] = load_dataset("gsm8k", tmp_path)
    assert (problem.dataset, problem.id, problem.answer) == ("gsm8k", "0", "72")
    assert problem.system_prompt is None
    assert grade(problem, "48 + 24 = 72, so the answer is 72.")
    assert not grade(problem, "the answer is 71")
