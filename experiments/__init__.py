"""Experiments that drive the project like a user, outside the package (nothing in it imports
them): the paper's Table 1 (`python -m experiments.table1`, through the `mur` command), the
re-scoring of recorded steps on another server (`experiments.rescore`) and forced critic
verdicts replayed on recorded judgements (`experiments.verdicts`)."""
