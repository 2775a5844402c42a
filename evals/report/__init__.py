"""Reports: the paper-style tables, plots and comparisons, recomputed from a folder's records
(`python -m evals.report DIR` runs evals.report.tables; `python -m evals.compare A B` runs
evals.report.compare)."""
