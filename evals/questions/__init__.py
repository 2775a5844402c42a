"""Questions and grading: the benchmarks (one registry entry each), their loaders, and the
comparisons that grade an answer against the gold one."""

from mur.evals.questions.datasets import DATASETS, PUBLIC_DATASETS, REGISTRY, check_dataset, grade
from mur.evals.questions.grading import (
    GradingUnavailableError,
    choice_equal,
    extract_answer,
    integer_equal,
    math_equal,
    parse_aime_int,
    parse_choice_letter,
)
from mur.evals.questions.loading import (
    DATA_DIR_ENV,
    HF_SOURCE,
    SHIPPED_DATA_DIR,
    dataset_file,
    load_dataset,
    resolve_data_dir,
)
from mur.evals.questions.problem import (
    DataNotFoundError,
    Dataset,
    DatasetError,
    HubSplit,
    MalformedRecordError,
    Parsed,
    Problem,
)

__all__ = [
    "DATASETS",
    "DATA_DIR_ENV",
    "HF_SOURCE",
    "PUBLIC_DATASETS",
    "REGISTRY",
    "SHIPPED_DATA_DIR",
    "DataNotFoundError",
    "Dataset",
    "DatasetError",
    "GradingUnavailableError",
    "HubSplit",
    "MalformedRecordError",
    "Parsed",
    "Problem",
    "check_dataset",
    "choice_equal",
    "dataset_file",
    "extract_answer",
    "grade",
    "integer_equal",
    "load_dataset",
    "math_equal",
    "parse_aime_int",
    "parse_choice_letter",
    "resolve_data_dir",
]
