"""`python -m endpoint`: see endpoint/cli.py."""

import sys

from mur.endpoint.cli import main

sys.exit(main())
