"""`python -m evals.report DIR`: a run folder's tables and plots (evals.report.tables)."""

import sys

from mur.evals.report.tables import main

if __name__ == "__main__":
    sys.exit(main())
