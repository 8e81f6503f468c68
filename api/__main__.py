"""`python -m api serve ...`: the same as the `batchgate` console script."""

import sys

from api.cli import main

sys.exit(main())
