"""`python -m evals.compare A B`: two results folders side by side (evals.report.compare)."""

import sys

from mur.evals.report.compare import main

if __name__ == "__main__":
    sys.exit(main())
