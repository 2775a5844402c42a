"""Benchmarks and grading for MUR: load problems, extract and grade answers.

``evals`` drives the graph like any other user; nothing in ``graphs/`` or ``nodes/`` imports it.
"""

from evals.datasets import (
    DATA_DIR_ENV,
    DATASETS,
    HF_SOURCE,
    PUBLIC_DATASETS,
    SHIPPED_DATA_DIR,
    SYSTEM_PROMPTS,
    DataNotFoundError,
    DatasetError,
    MalformedRecordError,
    Problem,
    dataset_file,
    load_dataset,
    resolve_data_dir,
)
from evals.grading import (
    GradingUnavailableError,
    extract_answer,
    grade,
    math_equal,
    parse_aime_int,
    parse_choice_letter,
)

__all__ = [
    "DATASETS",
    "DATA_DIR_ENV",
    "HF_SOURCE",
    "PUBLIC_DATASETS",
    "SHIPPED_DATA_DIR",
    "SYSTEM_PROMPTS",
    "DataNotFoundError",
    "DatasetError",
    "GradingUnavailableError",
    "MalformedRecordError",
    "Problem",
    "dataset_file",
    "extract_answer",
    "grade",
    "load_dataset",
    "math_equal",
    "parse_aime_int",
    "parse_choice_letter",
    "resolve_data_dir",
]
