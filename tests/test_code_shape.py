"""Code shape the developers' guide asks for: no function over ~60 lines in cost_models/, planner/ and
cluster_specs/ (ruff's C901 bounds the branches; this bounds the length, which ruff cannot)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 60


def test_no_function_is_longer_than_60_lines():
    long = []
    for package in ("cost_models", "planner", "cluster_specs"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_LINES:
                        long.append(f"{rel}:{node.lineno} {node.name} ({length} lines)")
    assert long == [], "functions over 60 lines:\n" + "\n".join(long)

