"""Performance suites, outside the package: each drives the project like a user would and
prints or writes a table (`mur bench <suite>`); nothing in the package imports them.
Results and their reading are recorded in BENCHMARKS.md."""
