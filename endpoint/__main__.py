"""`python -m endpoint`: see endpoint/cli.py."""

import sys

from endpoint.cli import main

sys.exit(main())
