"""`python -m mur.evals.compare A B`: the same as `mur compare A B` (evals.report.compare)."""

import sys

from mur.evals.report.compare import main

if __name__ == "__main__":
    sys.exit(main())
