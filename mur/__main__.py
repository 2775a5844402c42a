"""`python -m mur`: the `mur` command, for an environment whose scripts are not on the PATH."""

import sys

from mur.cli import main

if __name__ == "__main__":
    sys.exit(main())
