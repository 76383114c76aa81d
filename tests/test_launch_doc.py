"""docs/launch.md (issue #11's closing tables) is what tests/launch_tables.py generates from the tests' data now, and
every test it names exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_named_test_exists():
    from launch_tables import POINTS

    source = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
    for point, tests in POINTS:
        for name in tests:
            assert re.search(rf"^def {name}\(", source, re.M), (point, name)


def test_docs_launch_is_current():
    from launch_tables import document

    assert (ROOT / "docs" / "launch.md").read_text() == document(), \
        "docs/launch.md is stale: make launch-doc"
