"""Entry point of one rank's process: ``python -m tracekit.collectors._rank FD`` (see collectors.launch)."""

import sys

from tracekit.collectors.launch import rank_main

if __name__ == "__main__":
    sys.exit(rank_main(int(sys.argv[1])))
