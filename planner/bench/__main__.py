"""`python -m planner.bench ...` is `planner bench ...` (the entry point torchrun launches on every node)."""

import sys

from planner.cli import main

if __name__ == "__main__":
    sys.argv = ["planner", "bench", *sys.argv[1:]]
    main()
