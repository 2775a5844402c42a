"""Evaluations of MUR, in three rooms that drive the graph like any other user (nothing in
``graphs/`` or ``nodes/`` imports them):

- ``evals.questions``: the benchmarks (one registry entry each), their loaders and grading;
- ``evals.harness``: an evaluation run: its plan, the runner, records.jsonl, checkpoints,
  progress, stopping, and worker processes (``--workers``);
- ``evals.report``: tables, plots and comparisons recomputed from a folder's records
  (``mur report DIR``, ``mur compare A B``).

``evals.evaluation`` joins them for ``mur solve --dataset``: run a plan, then write its report.
"""
