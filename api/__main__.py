"""`python -m api serve ...` and the `batchgate` console script (`main`). Ctrl-C is the
command line's from the first moment (`api.stopped.stop_now`), before the server's modules
load."""

import signal
import sys

from api.stopped import stop_now


def main() -> int:
    signal.signal(signal.SIGINT, stop_now)
    from api.cli import main as command_line  # ~0.1 s of imports: Ctrl-C is ours already

    return command_line()


if __name__ == "__main__":
    sys.exit(main())
