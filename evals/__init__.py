"""Evaluations of MUR, in three rooms that drive the graph like any other user (nothing in
``graphs/`` or ``nodes/`` imports them): ``evals.questions`` (the benchmarks and their
grading), ``evals.harness`` (an evaluation run) and ``evals.report`` (tables, plots and
comparisons recomputed from a folder's records); ``evals.evaluation`` joins them for
``mur solve --dataset``: run a plan, then write its report.
"""
