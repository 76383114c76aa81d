"""`make mutate`'s score: mutmut's results for the mutants matching the given globs (all when none).

Killed = a test failed or the mutant timed out (a loop that no longer ends); survived, no tests (no test of the
subset reaches the function), suspicious and segfault count against it; mutants not yet checked are left out.
Usage: python tests/mutation_score.py [GLOB ...] (run from the repository root, after `mutmut run`)."""

import collections
import fnmatch
import shutil
import subprocess
import sys
from pathlib import Path


def main(patterns: list[str]) -> int:
    exe = shutil.which("mutmut") or str(Path(sys.executable).with_name("mutmut"))
    out = subprocess.run([exe, "results", "--all", "true"], capture_output=True, text=True, check=True).stdout
    counts: collections.Counter[str] = collections.Counter()
    for line in out.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name and (not patterns or any(fnmatch.fnmatch(name, p) for p in patterns)):
            counts[status] += 1
    killed = counts["killed"] + counts["timeout"]
    checked = sum(n for status, n in counts.items() if status != "not checked")
    print(f"mutation score: {killed}/{checked} = {killed / max(checked, 1):.1%} killed "
          f"({dict(sorted(counts.items()))}; `mutmut results` lists the survivors)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
