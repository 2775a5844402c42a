"""`mur bench` commands: each module's parser and main over benchmarks/."""
