"""`python -m freetoken.cli` = `ft` (benchmarks spawn their workers this way)."""

import sys

from freetoken.cli import main

sys.exit(main())
