"""`python -m mur.evals.report DIR`: the same as `mur report DIR` (evals.report.tables)."""

import sys

from mur.evals.report.tables import main

if __name__ == "__main__":
    sys.exit(main())
