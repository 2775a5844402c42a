"""Selection rules of the refine strategies: pure functions of numbers and texts."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence

import numpy as np

from mur.nodes.extras import require


def argmax_first(scores: Sequence[float]) -> int:
    """The index of the best score; ties go to the first (the order candidates came in)."""
    if not scores:
        raise ValueError("no candidates to choose from")
    best = 0
    for i, score in enumerate(scores):
        if score > scores[best]:
            best = i
    return best


def softmax(values: Sequence[float]) -> list[float]:
    """A numerically stable softmax; -inf entries get weight 0 (all -inf: uniform)."""
    if not values:
        return []
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return [1.0 / len(values)] * len(values)
    top = max(finite)
    exps = [math.exp(v - top) if math.isfinite(v) else 0.0 for v in values]
    total = math.fsum(exps)
    return [e / total for e in exps]


def _labels_by_identity(texts: Sequence[str]) -> list[int]:
    first_seen: dict[str, int] = {}
    return [first_seen.setdefault(text, len(first_seen)) for text in texts]


def cluster_labels(texts: Sequence[str], *, k: int = 2, seed: int = 0) -> list[int]:
    """phi-Decoding's clusters: TF-IDF + k-means with k = min(k, distinct texts).

    Texts with no words at all (empty rollouts, bare numbers TF-IDF drops) cannot be
    vectorised; then identical texts share a cluster.
    """
    distinct = len(set(texts))
    k = min(k, distinct)
    if k <= 1:
        return [0] * len(texts)
    # Imported here: scikit-learn (with scipy) takes about a second to import, and only the
    # foresight strategy clusters; every command line would otherwise pay it before starting.
    require("lab", "foresight's clustering")
    from sklearn.cluster import KMeans  # noqa: PLC0415
    from sklearn.feature_extraction.text import TfidfVectorizer  # noqa: PLC0415

    try:
        vectors = TfidfVectorizer().fit_transform(texts)
    except ValueError:  # empty vocabulary: nothing for TF-IDF to weigh
        return _labels_by_identity(texts)
    distinct_vectors = len({row.tobytes() for row in vectors.toarray()})
    k = min(k, distinct_vectors)
    if k <= 1:
        return [0] * len(texts)
    model = KMeans(n_clusters=k, n_init=10, random_state=seed)
    return [int(label) for label in model.fit_predict(vectors)]


def foresight_weights(scores: Sequence[float], labels: Sequence[int]) -> list[float]:
    """(softmax(rollout scores) + softmax(size of each candidate's cluster)) / 2."""
    if len(scores) != len(labels):
        raise ValueError("one cluster label per candidate score is needed")
    sizes = Counter(labels)
    by_score = softmax(scores)
    by_cluster = softmax([float(sizes[label]) for label in labels])
    return [(a + b) / 2 for a, b in zip(by_score, by_cluster, strict=True)]


def sample_index(weights: Sequence[float], seed: int) -> int:
    """A seeded draw of an index with probability proportional to its weight."""
    if not weights or not math.isfinite(sum(weights)) or sum(weights) <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {weights}")
    return random.Random(seed).choices(range(len(weights)), weights=weights, k=1)[0]


def mean_logprob(logprobs: Sequence[float]) -> float:
    """A rollout's score: the mean logprob of its tokens."""
    if len(logprobs) == 0:
        raise ValueError("an empty rollout has no mean logprob")
    return float(np.mean(logprobs))
