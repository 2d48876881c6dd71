"""`python -m torchfleet_bench COMMAND [ARGS...]` (the same as `torchfleet-bench`)."""

import sys

from torchfleet_bench.cli import main

sys.exit(main())
