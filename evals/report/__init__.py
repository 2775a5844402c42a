"""Reports: the paper-style tables, plots and comparisons, recomputed from a folder's records
(`mur report DIR` runs evals.report.tables; `mur compare A B` runs evals.report.compare)."""
