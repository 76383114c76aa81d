"""Bash conditions over values a script states, evaluated without running anything (bash(1): "CONDITIONAL
EXPRESSIONS", `test`, `[[ ... ]]`; "Lists": `&&` and `||` left to right, of equal precedence).

A condition is decided three-valued: True, False, or None where it cannot be without running something (a command, a
file test, a value the reader could not know); `&&`, `||` and `!` follow Kleene's logic, so `A || B` is True once
either side is True even when the other cannot be decided. `Eval.why` keeps the first reason a part was undecided.
"""

from __future__ import annotations

import ast
import fnmatch
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field


class Undecidable(Exception):
    """A value the planner cannot know; the message says why."""


# file and terminal tests: their answer is on the machine that runs the script
_FILE_TESTS = frozenset("-a -b -c -d -e -f -g -h -k -p -r -s -t -u -w -x -G -L -N -O -S".split())
_INT_OPS = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__, "-gt": int.__gt__,
            "-ge": int.__ge__}
_STR_OPS = ("=", "==", "!=", "<", ">")
_INT = re.compile(r"\s*[+-]?[0-9]+\s*")


def kleene_and(a: bool | None, b: bool | None) -> bool | None:
    return False if a is False or b is False else None if a is None or b is None else True


def kleene_or(a: bool | None, b: bool | None) -> bool | None:
    return True if a is True or b is True else None if a is None or b is None else False


def kleene_not(a: bool | None) -> bool | None:
    return None if a is None else not a


def split_list(words: list[str]) -> list[tuple[str, list[str]]]:
    """A list's commands, each with the operator before it ("" for the first): `a && b || c` ->
    [("", a), ("&&", b), ("||", c)]; the `&&` / `||` inside `[[ ... ]]` belong to its test."""
    parts: list[tuple[str, list[str]]] = []
    op, start, depth = "", 0, 0
    for i, w in enumerate(words):
        depth += (w == "[[") - (w == "]]")
        if w in ("&&", "||") and depth <= 0:
            parts.append((op, words[start:i]))
            op, start = w, i + 1
    parts.append((op, words[start:]))
    return parts


@dataclass
class Eval:
    """Decides a condition's words (raw, before expansion). `operand` expands one word to its value and `arith`
    evaluates bash integer arithmetic; either raises Undecidable where the value is not known."""

    operand: Callable[[str], str]
    arith: Callable[[str], int]
    why: list[str] = field(default_factory=list)

    def decide(self, words: list[str]) -> bool | None:
        """An `if` / `elif` condition: commands joined by `&&` / `||`, each maybe behind `!`."""
        result: bool | None = None
        for op, part in split_list(words):
            try:
                value = self._command(part)
            except RecursionError:
                value = self.undecided("nested too deeply to read")
            result = value if not op else kleene_and(result, value) if op == "&&" else kleene_or(result, value)
        return result

    def _command(self, words: list[str]) -> bool | None:
        if words[:1] == ["!"]:
            return kleene_not(self._command(words[1:]))
        head = words[0] if words else ""
        if head == "[" and words[-1] == "]" or head == "test":
            return self._test(words[1:-1] if head == "[" else words[1:], double=False)
        if head == "[[" and words[-1] == "]]":
            return self._test(words[1:-1], double=True)
        if len(words) == 1 and head.startswith("((") and head.endswith("))"):
            return self._arith_test(head[2:-2])
        if head in ("true", ":", "false") and len(words) == 1:
            return head != "false"
        return self.undecided(f"`{' '.join(words)[:60]}` runs a command")

    def undecided(self, why: str) -> bool | None:
        self.why.append(why)
        return None

    def _arith_test(self, expr: str) -> bool | None:
        try:
            return self.arith(expr) != 0
        except Undecidable as exc:
            return self.undecided(str(exc))

    def _test(self, args: list[str], *, double: bool) -> bool | None:
        value, end = _Test(self, args, double).expression(0)
        return value if end == len(args) else self.undecided(f"`{' '.join(args)[:60]}`: a test the planner does "
                                                               "not read")

    def value(self, raw: str) -> str | None:
        try:
            return self.operand(raw)
        except Undecidable as exc:
            self.undecided(str(exc))
            return None


@dataclass
class _Test:
    """The expression inside `[ ... ]` / `test` (double=False: -a / -o join) or `[[ ... ]]` (&& / || join)."""

    ev: Eval
    args: list[str]
    double: bool

    def expression(self, i: int) -> tuple[bool | None, int]:
        value, i = self._conjunction(i)
        while i < len(self.args) and self.args[i] == ("||" if self.double else "-o"):
            rhs, i = self._conjunction(i + 1)
            value = kleene_or(value, rhs)
        return value, i

    def _conjunction(self, i: int) -> tuple[bool | None, int]:
        value, i = self._negation(i)
        while i < len(self.args) and self.args[i] == ("&&" if self.double else "-a"):
            rhs, i = self._negation(i + 1)
            value = kleene_and(value, rhs)
        return value, i

    def _negation(self, i: int) -> tuple[bool | None, int]:
        if i < len(self.args) and self.args[i] == "!":
            value, i = self._negation(i + 1)
            return kleene_not(value), i
        return self._primary(i)

    def _primary(self, i: int) -> tuple[bool | None, int]:
        a = self.args
        if i >= len(a):
            return self.ev.undecided("an empty test"), i
        if a[i] in ("(", "\\("):
            value, j = self.expression(i + 1)
            return value, j + (j < len(a) and a[j] in (")", "\\)"))
        if i + 2 < len(a) and a[i + 1] in (*_INT_OPS, *_STR_OPS, "=~"):
            return self._binary(a[i], a[i + 1], a[i + 2]), i + 3
        if a[i].startswith("-") and i + 1 < len(a) and len(a[i]) == 2:
            return self._unary(a[i], a[i + 1]), i + 2
        word = self.ev.value(a[i])
        return (None if word is None else word != ""), i + 1

    def _unary(self, op: str, raw: str) -> bool | None:
        if op in _FILE_TESTS:
            return self.ev.undecided(f"`{op} {raw}` tests the filesystem")
        if op in ("-n", "-z"):
            word = self.ev.value(raw)
            return None if word is None else (word != "") == (op == "-n")
        return self.ev.undecided(f"`{op} {raw}`: a test the planner does not read")

    def _binary(self, left: str, op: str, right: str) -> bool | None:
        if op == "=~":
            return self.ev.undecided(f"`{left} =~ {right}`: a regular expression match")
        a, b = self.ev.value(left), self.ev.value(right)
        if a is None or b is None:
            return None
        if op in _INT_OPS:
            x, y = self._integer(a), self._integer(b)
            return None if x is None or y is None else _INT_OPS[op](x, y)
        if op in ("<", ">"):
            return a < b if op == "<" else a > b
        # in [[ ]], an unquoted right side of == / != is a pattern
        same = fnmatch.fnmatchcase(a, b) if self.double and not re.search(r"['\"]", right) else a == b
        return same if op != "!=" else not same

    def _integer(self, word: str) -> int | None:
        """An operand of -eq ... -ge: `[[ ]]` evaluates it as arithmetic (an empty one is 0); `[` needs an integer
        (bash's test fails with "integer expression expected": not decided here)."""
        if _INT.fullmatch(word):
            return int(word)
        if not self.double:
            self.ev.undecided(f"`{word}` is not an integer (bash's test errors)")
            return None
        try:
            return self.ev.arith(word or "0")
        except Undecidable as exc:
            self.ev.undecided(str(exc))
            return None


# ---- integer arithmetic ----------------------------------------------------------------------------------------

_NAME = re.compile(r"(?<![0-9A-Za-z_])[A-Za-z_][A-Za-z0-9_]*")
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Eq: operator.eq,
            ast.NotEq: operator.ne}
BASH_INT_LIMIT = 2**63  # bash's arithmetic is in 64-bit signed integers (intmax_t)


def arithmetic(expr: str, value_of: Callable[[str], str | None]) -> int:
    """bash integer arithmetic, `$(( expr ))` and `(( expr ))`, over + - * / % and parentheses, unary + and -, and
    the comparisons < <= > >= == != (1 or 0). A name reads the file's variable (`value_of`; None where unset), whose
    value must be an integer. `/` truncates toward zero and `%` takes the dividend's sign (bash's C arithmetic).
    Anything else (assignments, ++, ?:, && ||, bit operations, 2#101 bases, octal 010) raises Undecidable, as do
    division by zero and results beyond 64 bits. The text is parsed with `ast` and walked over that whitelist: it is
    never executed."""
    if "#" in expr:  # bash's base#digits (2#11 is 3); Python would read the rest as a comment
        raise Undecidable(f"`{expr.strip()}`: base#digits numbers are not arithmetic the planner evaluates")
    py = _NAME.sub(lambda m: _name_value(m.group(), value_of), expr)
    if re.search(r"[0-9]_|0[oObB]", py):  # Python reads 1_000, 0o17 and 0b1 as numbers; bash refuses them
        raise Undecidable(f"`{expr.strip()}`: not integer arithmetic the planner evaluates")
    try:
        return _value(ast.parse(py.strip(), mode="eval").body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise Undecidable(f"`{expr.strip()}`: not integer arithmetic the planner evaluates") from None


def _name_value(name: str, value_of: Callable[[str], str | None]) -> str:
    value = value_of(name)
    if value is None:
        raise Undecidable(f"{name} is not set in the file")
    if not re.fullmatch(r"\s*[+-]?[0-9]+\s*", value):
        raise Undecidable(f"{name} is {value!r}, not an integer")
    return f"({value.strip()})"


def _value(node: ast.expr) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        v = _value(node.operand)
        return _bounded(-v if isinstance(node.op, ast.USub) else v)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div | ast.Mod):
        a, b = _value(node.left), _value(node.right)
        if b == 0:
            raise Undecidable("division by 0")
        q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)  # C: toward zero
        return _bounded(q if isinstance(node.op, ast.Div) else a - b * q)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _bounded(_BINARY[type(node.op)](_value(node.left), _value(node.right)))
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        return int(_COMPARE[type(node.ops[0])](_value(node.left), _value(node.comparators[0])))
    raise Undecidable(f"`{ast.unparse(node)[:40]}`: not integer arithmetic the planner evaluates")


def _bounded(v: int) -> int:
    if not -BASH_INT_LIMIT <= v < BASH_INT_LIMIT:
        raise Undecidable(f"{v} is beyond bash's 64-bit integers")
    return v
