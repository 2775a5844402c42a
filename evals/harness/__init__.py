"""The benchmark harness: a run's plan (evals.harness.plan) and the Context of each of its runs
(evals.harness.contexts), the runner, the run record and records.jsonl (record, records),
checkpoints that resume a question mid-way, progress lines and stopping on a signal."""
