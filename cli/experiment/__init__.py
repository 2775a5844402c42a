"""`mur experiment` commands: each experiment's parser and main over experiments/."""
