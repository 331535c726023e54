"""``python -m harness``: the command line (harness.frontends.cli)."""
import sys

from harness.frontends.cli import main

if __name__ == "__main__":
    sys.exit(main())
