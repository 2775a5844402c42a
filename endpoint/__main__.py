"""`python -m mur.endpoint`: the same as `mur endpoint` (endpoint/cli.py)."""

import sys

from mur.endpoint.cli import main

if __name__ == "__main__":
    sys.exit(main())
