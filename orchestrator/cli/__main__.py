"""`python -m orchestrator.cli ...`: the same entry point as the `orch` console script."""

import sys

from orchestrator.cli import main

sys.exit(main())
