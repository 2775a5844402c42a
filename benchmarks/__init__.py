"""Performance suites: each drives MUR like a user and prints a table for BENCHMARKS.md."""
