"""`python -m brain [serve] [flags]`."""

import sys

from brain.cli import main

sys.exit(main())
