"""The benchmarks: one `Dataset` entry each. This registry is their only list.

Adding a benchmark: put its file in evals/questions/data (or, for a set that must not ship,
say where to get it with `public=False, access=...`), write the entry below (its files, hub
source, system prompt, a parser for one record and the comparison that grades it) and list
it in `REGISTRY`. `load_dataset`, `grade`, `mur solve`'s `--dataset` help and the loaders' error
messages all follow from this list.
"""

from __future__ import annotations

from mur.evals.questions import parsers
from mur.evals.questions.grading import choice_equal, extract_answer, integer_equal, math_equal
from mur.evals.questions.problem import Dataset, HubSplit, Problem
from mur.nodes.registry import Registry

_AIME_SYSTEM = "You are a helpful math assistant."

MATH500 = Dataset(
    name="math500",
    title="MATH-500",
    files=("math500.jsonl",),
    hub=(HubSplit("HuggingFaceH4/MATH-500", None, "test"),),
    system_prompt=None,
    parse=parsers.math500,
    grade=math_equal,
)
AIME24 = Dataset(
    name="aime24",
    title="AIME 2024",
    files=("aime24.jsonl",),
    hub=(HubSplit("HuggingFaceH4/aime_2024", None, "train"),),
    system_prompt=_AIME_SYSTEM,
    parse=parsers.aime24,
    grade=integer_equal,
)
AIME25 = Dataset(
    name="aime25",
    title="AIME 2025",
    files=("aime25.jsonl",),
    hub=(
        HubSplit("opencompass/AIME2025", "AIME2025-I", "test"),
        HubSplit("opencompass/AIME2025", "AIME2025-II", "test"),
    ),
    system_prompt=_AIME_SYSTEM,
    parse=parsers.aime25,
    grade=integer_equal,
)
GPQA_DIAMOND = Dataset(
    name="gpqa_diamond",
    title="GPQA-diamond",
    files=("gpqa_diamond.jsonl.gz", "gpqa_diamond.jsonl"),
    hub=(HubSplit("Idavidrein/gpqa", "gpqa_diamond", "train"),),
    system_prompt='You are a helpful assistant. Please answer "A", "B", "C", or "D".',
    parse=parsers.gpqa,
    grade=choice_equal,
    public=False,  # its authors ask that it never appear in plain text online
    access="its authors ask that it never appear in plain text online; Idavidrein/gpqa on "
    "the hub is gated: accept its terms there, then `hf auth login`",
)

REGISTRY: Registry[Dataset] = Registry("dataset", MATH500, AIME24, AIME25, GPQA_DIAMOND)
#: The benchmark names ``load_dataset`` accepts.
DATASETS: tuple[str, ...] = REGISTRY.names
#: The benchmarks whose files ship inside the project.
PUBLIC_DATASETS: tuple[str, ...] = tuple(d.name for d in REGISTRY.values() if d.public)


def check_dataset(name: str) -> Dataset:
    """The registry entry of ``name`` (case-insensitive), or a ValueError naming the valid
    ones."""
    return REGISTRY[name.strip().lower() if isinstance(name, str) else name]


def describe() -> str:
    """The benchmarks as `--dataset` help lists them ("math500 (MATH-500), ...")."""
    return ", ".join(f"{d.name} ({d.title})" for d in REGISTRY.values())


def grade(problem: Problem, prediction: str | None) -> bool:
    """True iff ``prediction`` answers ``problem`` correctly, by its dataset's comparison.

    ``prediction`` is the extracted answer (``extract_answer``'s result, None when the model gave
    none). A whole solution works too: its answer is extracted first (where it states none, all
    of it is read as the answer, so pass None instead).
    """
    if not isinstance(prediction, str):
        return False
    entry = REGISTRY[problem.dataset]
    answer = extract_answer(prediction)
    return entry.grade(prediction if answer is None else answer, problem.answer)
