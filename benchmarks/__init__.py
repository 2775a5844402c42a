"""Performance suites: each drives the project like a user would and prints or writes a table
(`mur bench <suite>`); nothing in the package imports them, and the fakes they share with the
tests are in testing/. Results and their reading are recorded in BENCHMARKS.md."""
