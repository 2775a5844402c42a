"""Experiments that drive the project like a user, outside the package (nothing in it imports
them): the paper's Table 1 (`mur experiment table1`, which runs `mur solve` for each phase),
the re-scoring of recorded steps on another server (`mur experiment rescore`) and forced critic
verdicts replayed on recorded judgements (`mur experiment verdicts`)."""
