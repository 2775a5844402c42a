"""MUR from the command line: solve one question step by step, or run an evaluation.

    python run.py --strategy critic                       # the built-in sample problem
    python run.py --strategy critic --question "..." --json
    python run.py --strategy critic --dataset math500 --limit 8 --gate mur,always,never --out DIR

The same command as `mur solve` (cli/solve.py); `mur --help` lists the others. Without
--base-url (or MUR_BASE_URL) it uses the embedded CPU vLLM server (reused when healthy,
started if not).
"""

import sys

from mur.cli.solve import main

if __name__ == "__main__":
    sys.exit(main(prog="run.py"))
