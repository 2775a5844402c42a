"""How each benchmark's source records read as problems (a `Dataset` entry's `parse`).

GPQA's choices are unlettered in the source, so they are shuffled here with a permutation
derived from each question's Record ID: the same letters on every machine, Python version and
run, which keeps results comparable. No error message here quotes a record.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from mur.evals.questions.problem import Fields, Parsed

LETTERS = "ABCD"
_AIME_URL = re.compile(r"(\d{4})_AIME_(I{1,2})_Problems/Problem_(\d+)")


def math500(fields: Fields, index: int) -> Parsed:
    return Parsed(
        id=fields.text("unique_id"),
        question=fields.text("problem"),
        answer=fields.text("answer"),
        metadata={"subject": fields.get("subject"), "level": fields.get("level")},
    )


def aime24(fields: Fields, index: int) -> Parsed:
    metadata: dict[str, Any] = {"year": 2024}
    url = fields.get("url")
    if isinstance(url, str):
        metadata["url"] = url
        match = _AIME_URL.search(url)
        if match:
            metadata.update(contest=match.group(2), number=int(match.group(3)))
    return Parsed(
        id=fields.text("id") if fields.has("id") else str(index),
        question=fields.text("problem", "question"),
        answer=fields.integer_answer("answer"),
        metadata=metadata,
    )


def aime25(fields: Fields, index: int) -> Parsed:
    # Local ids "0"-"14" are AIME I and "15"-"29" AIME II; the hub copy has no ids and lists
    # AIME I then AIME II, so its row index gives the same ids.
    problem_id = fields.text("id") if fields.has("id") else str(index)
    metadata: dict[str, Any] = {"year": 2025}
    if problem_id.isdigit() and int(problem_id) < 30:
        number = int(problem_id)
        metadata.update(contest="I" if number < 15 else "II", number=number % 15 + 1)
    return Parsed(
        id=problem_id,
        question=fields.text("problem", "question"),
        answer=fields.integer_answer("answer"),
        metadata=metadata,
    )


def gpqa(fields: Fields, index: int) -> Parsed:
    record_id = fields.text("Record ID")
    options = [fields.text("Correct Answer")] + [
        fields.text(f"Incorrect Answer {k}") for k in (1, 2, 3)
    ]
    order = choice_order(record_id)
    choices = {letter: options[source] for letter, source in zip(LETTERS, order, strict=True)}
    correct_letter = LETTERS[order.index(0)]
    lettered = "\n".join(f"{letter}) {text}" for letter, text in choices.items())
    return Parsed(
        id=record_id,
        question=f"{fields.text('Question')}\n\n{lettered}",
        answer=correct_letter,
        metadata={
            "choices": choices,
            "correct_letter": correct_letter,
            "record_id": record_id,
            "domain": fields.get("High-level domain"),
            "subdomain": fields.get("Subdomain"),
        },
    )


def choice_order(record_id: str) -> list[int]:
    """Which source option (0 = correct) goes under A, B, C, D for this question.

    A permutation from SHA-256 of the Record ID: stable across runs, machines and Python
    versions (unlike ``hash()`` or ``random``'s algorithms), uniform over the 24 orders.
    """
    return sorted(
        range(len(LETTERS)),
        key=lambda option: hashlib.sha256(f"mur-gpqa:{record_id}:{option}".encode()).digest(),
    )
