"""The evaluation harness: a run's plan (evals.harness.plan, each run's Context made by
graphs.state.context_for), the runner, the run record and records.jsonl (run_record, records),
checkpoints that resume a question mid-way, progress lines and stopping on a signal, and the
run's questions in worker processes (`--workers N`: pool, the parent's side; worker)."""
