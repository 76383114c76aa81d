"""A launch script read as bash would run it, without running anything: the Megatron-LM / Megatron-DeepSpeed
arguments it passes to its `*.py` entry point, and the variables it sets.

What is read as bash reads it (bash(1): "Comments", "QUOTING", "Arrays", "EXPANSION"):
- statements: a comment ends at its line (`# ... \\` does not continue onto the next line), then backslash-newline
  joins lines; quotes and `( ... )` spanning lines stay whole; heredoc bodies are skipped; `;` separates;
- assignments: NAME=word, NAME+=word, arrays NAME=( ... ) and NAME+=( ... ), behind export / local / declare /
  readonly; `unset NAME`;
- expansion: $NAME, ${NAME}, ${NAME[@]}, ${NAME[*]}, ${NAME[i]}, ${#NAME}, ${NAME:-word} / ${NAME-word} /
  ${NAME:=word} / ${NAME:+word}; the script is read as run with no arguments, so $1.. are unset and
  ${1:-word} is its word; an unquoted result is split into words, a quoted one is not, and "${A[@]}" is one word
  per element;
- the launch: a command that runs a `*.py` file (through torchrun, deepspeed, srun, `bash -c "..."`, `eval`);
  its arguments are the words after the `*.py` file up to a pipe, `;`, `&&` or a redirection. The launcher's own
  options (torchrun's, srun's, nsys's) are not Megatron's and are not read.

What cannot be known without running something (`$( ... )`, backquotes, a variable the file never sets) stays an
opaque word, recorded in `ShellRead.unknown` with why; `refusals` names it when it is the value of an option the
planner reads.

Branches (`if` / `elif` / `else`, and lists `a && b || c`): only the branch bash would take is read.
1. A test over values the file states (`[ ]`, `[[ ]]`, `test`, `(( ))`; = == != < > -eq -ne -lt -le -gt -ge -n -z,
   `!`, && || -a -o; shell_eval.py) is evaluated, and only the branch it selects is read.
2. A test that reads a variable the file never sets (the environment's, a script argument $1..) is evaluated with
   it unset, which is what bash does when the script is run without it, and a note names the line, the variable and
   what the condition came to: the user sees which branch was assumed.
3. A condition that cannot be decided without running something (a command, `$( ... )`, a file test such as -f, a
   value that is itself unknown) selects no branch: the variables any of its branches assign become unknown, and
   the check refuses (exit 3) where such a variable reaches Megatron's arguments, naming the line, the condition and
   the variable. A branch that assigns nothing the launch uses (`if [ ! -f pretrain_gpt.py ]; then echo ...; exit
   1; fi`) changes nothing that is read, and is passed over without a word.
Loops and `case` are not run: their bodies are read as rule 3 (a loop over "$@" runs zero times: the script is read
as run without arguments); a function body likewise. In a list, a command other than a test is taken to succeed
(`mkdir -p D || exit 1` and `cd D && torchrun ...` guard errors). An `exit` on the path read ends the script; one
with a non-zero status before any launch is refused by the reader that finds no launch.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from planner.integrations.shell_eval import Eval, Undecidable, arithmetic, split_list

MAX_VALUE_CHARS = 1_000_000  # [choice] a launch script's values are kilobytes; the bound stops `A=$A$A` doubling


class ShellError(ValueError):
    """A script the reader will not read (one line: where and why)."""


# One piece of shell text: a comment only where a word may start (`${#X}` and `a#b` are not comments)
_PIECE = re.compile(r"""
    (?P<comment>(?<![^\s;&|()])\#[^\n]*)
  | (?P<single>'[^']*'?)
  | (?P<double>"(?:\\.|[^"\\])*"?)
  | (?P<back>`(?:\\.|[^`\\])*`?)
  | (?P<cont>\\\r?\n)
  | (?P<escape>\\.?)
  | (?P<newline>\r?\n)
  | (?P<semi>;)
  | (?P<open>\()
  | (?P<close>\))
  | (?P<blank>[ \t]+)
  | (?P<word>[^\s'"`\\;()]+)
  | (?P<other>.)
""", re.X | re.S)
_CONTINUATION = re.compile(r"\\\r?\n")
_HEREDOC = re.compile(r"(?<!<)<<-?\s*\\?['\"]?([A-Za-z_][A-Za-z0-9_]*)")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)", re.S)
_DECLARE = frozenset({"export", "local", "declare", "typeset", "readonly"})
_PARAM = re.compile(r"(#?)([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!-])(?:\[([@*]|[0-9]+)\])?(?:(:?[-=+?])(.*))?", re.S)
_SIMPLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]|[@*#?$!-]")
# words that end a command's arguments: a pipe, a list operator, a redirection
_OPERATOR = re.compile(r"\|\|?|&&|&|;|\|&|[0-9]*>>?.*|&>>?.*|<.*")
# commands whose words are not a launch even when they name a *.py file
_NOT_LAUNCH = frozenset({"echo", "printf", "cat", "ls", "cp", "mv", "rm", "mkdir", "wget", "curl", "test", "[",
                         "sed", "grep", "tee", "chmod", "touch", "export", "unset", "cd"})


@dataclass(frozen=True)
class Unknown:
    """A value the planner cannot know without running the script: where, what, and why."""

    line: int
    construct: str
    why: str  # "" for a variable the file never sets (the environment's, the script's arguments)
    anywhere: bool = False  # a variable set under an undecided branch: not known anywhere in Megatron's arguments


@dataclass(frozen=True)
class Launch:
    """A command that runs a `*.py` file: its line, the file, and the words after it (the program's arguments)."""

    line: int
    program: str
    argv: list[str]


@dataclass
class ShellRead:
    """What a script sets and launches, read by `read_script`."""

    launches: list[Launch]
    commands: list[str]  # the words of every command read, for an argument file that launches nothing
    env: dict[str, str]  # the variables the script sets (an array's elements joined by spaces)
    unknown: dict[str, Unknown]  # opaque word -> why its value is not known
    notes: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)  # launches in branches that cannot be decided
    stopped: str = ""  # an `exit` with a non-zero status on the path read (before any launch: why it launches none)


def statements(text: str) -> list[tuple[int, str]]:
    """(line number, statement) of shell text, as bash reads it: comments dropped first (a comment ending in `\\`
    does not continue), then backslash-newline joined; a quote or `( ... )` spanning lines kept whole; a heredoc's
    body skipped; `;` and newlines separate statements (a line ending in `|` or `&&` goes on)."""
    return _Lexer(text).run()


@dataclass
class _Lexer:
    text: str
    out: list[tuple[int, str]] = field(default_factory=list)
    buf: list[str] = field(default_factory=list)
    heredocs: list[str] = field(default_factory=list)
    depth: int = 0
    line: int = 1
    start: int = 1

    def run(self) -> list[tuple[int, str]]:
        pos = 0
        while pos < len(self.text):
            m = _PIECE.match(self.text, pos)
            if m is None:  # `other` matches any character: unreachable, kept for the type checker
                break
            pos = self._take(m.lastgroup or "other", m.group(), m.end())
        self._flush()
        return self.out

    def _take(self, kind: str, piece: str, end: int) -> int:
        if kind == "comment":
            return end
        if kind == "newline" and self._ends_here():
            self._flush()
            self.line += 1
            return self._skip_heredocs(end)
        if kind == "semi" and self.depth == 0:
            self._flush()
            return end
        if kind == "open":
            self.depth += 1
        elif kind == "close":
            self.depth = max(0, self.depth - 1)
        text = {"cont": "", "newline": " ", "blank": " "}.get(kind, piece)
        if kind == "double":
            text = _CONTINUATION.sub("", piece)
        if text.strip() and not any(p.strip() for p in self.buf):
            self.start = self.line
        self.buf.append(text)
        self.line += piece.count("\n")
        return end

    def _ends_here(self) -> bool:
        tail = "".join(self.buf).rstrip()
        return self.depth == 0 and not tail.endswith(("|", "&&"))

    def _flush(self) -> None:
        stmt = "".join(self.buf).strip()
        self.buf = []
        if stmt:
            self.out.append((self.start, stmt))
            self.heredocs += _HEREDOC.findall(stmt)

    def _skip_heredocs(self, pos: int) -> int:
        for word in self.heredocs:
            m = re.compile(rf"(?m)^\t*{re.escape(word)}[ \t]*$").search(self.text, pos)
            stop = m.end() if m else len(self.text)
            self.line += self.text.count("\n", pos, stop)
            pos = stop
        self.heredocs = []
        return pos


def raw_words(stmt: str) -> list[str]:
    """A statement's words before expansion: split at blanks outside quotes, `( ... )` and `${ ... }`."""
    words: list[str] = []
    cur: list[str] = []
    depth = 0
    for m in re.finditer(r"""'[^']*'?|"(?:\\.|[^"\\])*"?|`(?:\\.|[^`\\])*`?|\\.?|\$\{[^}]*\}?|[()]|\s+|[^\s'"`\\()$]+|\$""",
                         stmt, re.S):
        piece = m.group()
        if piece.isspace() and depth == 0:
            if cur:
                words.append("".join(cur))
            cur = []
            continue
        depth = depth + 1 if piece == "(" else max(0, depth - 1) if piece == ")" else depth
        cur.append(piece)
    if cur:
        words.append("".join(cur))
    return words


def _bounded(text: str, line: int, name: str = "") -> str:
    """`text`, refused past MAX_VALUE_CHARS before it is split (splitting a long value takes time that grows with
    the square of its length: `A=$A$A` doubled 25 times took 18 s to reach the bound)."""
    if len(text) > MAX_VALUE_CHARS:
        raise ShellError(f"line {line}: {name + ': ' if name else ''}a value over {MAX_VALUE_CHARS:,} characters -> a "
                         "launch script's values are kilobytes; this is not one the planner reads")
    return text


def split_words(text: str) -> list[str]:
    """Quote removal and word splitting of expanded text (an unbalanced quote: split at blanks, quotes dropped)."""
    if not any(c in text for c in "'\"\\"):  # nothing to remove: shlex's answer, without its per-character cost
        return text.split()
    try:
        return shlex.split(text)
    except ValueError:
        return text.replace('"', " ").replace("'", " ").split()


def _closing(text: str, i: int, open_: str, close: str) -> int:
    """The index after the `close` that matches the `open_` at text[i] (quotes skipped), or len(text)."""
    depth = 0
    j = i
    while j < len(text):
        c = text[j]
        if c in "'\"":
            k = text.find(c, j + 1)
            j = len(text) if k < 0 else k + 1
            continue
        depth += (c == open_) - (c == close)
        j += 1 + (c == "\\")
        if depth == 0:
            return j
    return len(text)


def _opaque(construct: str) -> str:
    """A construct's stand-in word: one word (no blanks, no quotes) that names it."""
    token = re.sub(r"[\s'\"\\]+", "", construct)
    return token if len(token) <= 40 else token[:39] + "…"


@dataclass
class _Shell:
    """The variables as the script sets them, statement by statement."""

    vars: dict[str, str | list[str]] = field(default_factory=dict)
    unknown: dict[str, Unknown] = field(default_factory=dict)
    env_reads: list[str] = field(default_factory=list)  # unset variables read, in order
    notes: list[str] = field(default_factory=list)

    # ---- expansion -------------------------------------------------------------------------------------------

    def expand(self, text: str, line: int) -> str:
        """`text` with every $-expansion done, quoted so that `split_words` gives the words bash would."""
        out: list[str] = []
        quoted = False
        i = 0
        while i < len(text):
            c = text[i]
            if c == "'" and not quoted:
                j = text.find("'", i + 1)
                j = len(text) - 1 if j < 0 else j
                out.append(text[i:j + 1])
                i = j + 1
            elif c == "\\":
                out.append(text[i + 1:i + 2] if quoted and text[i + 1:i + 2] in ("$", "`") else text[i:i + 2])
                i += 2
            elif c == '"':
                quoted = not quoted
                out.append(c)
                i += 1
            elif c in "$`":
                values, i = self._substitution(text, i, line)
                out.append(_render(values, quoted))
            else:
                out.append(c)
                i += 1
        return "".join(out)

    def word(self, text: str, line: int, name: str = "") -> str:
        """One word's value (an assignment's right side, `name`'s; a default): expanded, quotes removed, not split."""
        return " ".join(split_words(_bounded(self.expand(text, line), line, name)))

    def _substitution(self, text: str, i: int, line: int) -> tuple[list[str], int]:
        """The values a `$...` or backquote at text[i] expands to, and the index after it."""
        if text.startswith("$((", i):
            end = _closing(text, i + 1, "(", ")")
            return [self._arithmetic(text[i + 3:end - 2], line)], end
        if text.startswith("$(", i):
            end = _closing(text, i + 1, "(", ")")
            return [self._command(text[i + 2:end - 1], line)], end
        if text[i] == "`":
            k = text.find("`", i + 1)
            end = len(text) if k < 0 else k + 1
            return [self._command(text[i + 1:end - 1], line)], end
        if text.startswith("${", i):
            end = _closing(text, i + 1, "{", "}")
            return self._parameter(text[i + 2:end - 1], text[i:end], line), end
        m = _SIMPLE_NAME.match(text, i + 1)
        if m is None:
            return ["$"], i + 1
        return self._parameter(m.group(), text[i:m.end()], line), m.end()

    def _command(self, body: str, line: int) -> str:
        first = (body.split() or [""])[0]
        return self._unknown(f"$({first}…)", line, f"`{_short(body)}` runs a command")

    def _arithmetic(self, body: str, line: int) -> str:
        try:
            return str(self.arithmetic(body, line))
        except Undecidable as exc:
            return self._unknown(f"$(({body}))", line, f"`$(( {_short(body)} ))` cannot be evaluated: {exc}")

    def _unknown(self, construct: str, line: int, why: str) -> str:
        token = _opaque(construct)
        self.unknown.setdefault(token, Unknown(line, construct, why))
        return token

    def _parameter(self, body: str, whole: str, line: int) -> list[str]:
        """${body}: a variable, an array, a length, a default."""
        m = _PARAM.fullmatch(body)
        if m is None:
            return [self._unknown(whole, line, f"`{_short(whole)}`: a parameter expansion the planner does not "
                                  "evaluate")]
        length, name, index, op, default = m.groups()
        if length:
            return [self._length(name, index, whole, line)]
        value = self._lookup(name, index)
        if op:
            return self._operator(name, value, op, default, line)
        if value is None:
            return [self._unset(name, whole)]
        return value

    def _length(self, name: str, index: str | None, whole: str, line: int) -> str:
        """${#NAME}: its length; ${#NAME[@]}: its element count."""
        value = self.vars.get(name)
        if value is None:
            return self._unknown(whole, line, f"${name} is not set in the file")
        elements = value if isinstance(value, list) else [value]
        return str(len(elements) if index in ("@", "*") else len(elements[0] if elements else ""))

    def _lookup(self, name: str, index: str | None) -> list[str] | None:
        """The words of NAME (one for a scalar, the elements of an array under [@] / [*]); None where unset."""
        if name in ("@", "*"):
            return []  # no arguments
        if name == "#":
            return ["0"]
        value = self.vars.get(name)
        if value is None:
            return None
        elements = value if isinstance(value, list) else [value]
        if index in ("@", "*"):
            return elements if index == "@" else [" ".join(elements)]
        at = int(index or 0)
        return [elements[at]] if at < len(elements) else None

    def _operator(self, name: str, value: list[str] | None, op: str, default: str, line: int) -> list[str]:
        """${NAME-word} ${NAME:-word} ${NAME=word} ${NAME:=word} ${NAME+word} ${NAME:+word} ${NAME?} ${NAME:?}."""
        if value is None:
            self.env_reads.append(name)
        present = value is not None and (not op.startswith(":") or any(value))
        kind = op[-1]
        if kind == "+":
            return [self.word(default, line)] if present else []
        if present:
            return value or []
        if kind == "?":
            return [self._unknown(f"${{{name}{op}}}", line, f"${name} is not set: the script stops there")]
        given = self.word(default, line)
        if kind == "=" and not name.isdigit():
            self.vars[name] = given
        return [given]

    def _unset(self, name: str, whole: str) -> str:
        self.env_reads.append(name)
        token = _opaque(whole)
        self.unknown.setdefault(token, Unknown(0, whole, ""))  # why "": not set in the file
        return token

    # ---- conditions ------------------------------------------------------------------------------------------

    def decide(self, keyword: str, words: list[str], line: int) -> tuple[bool | None, str]:
        """A condition's value, and why where it cannot be decided. A variable the file never sets reads as unset
        (what bash does with it not in the environment), and a note says so and what the condition came to."""
        start = len(self.env_reads)
        ev = Eval(lambda raw: self._operand(raw, line), lambda expr: self.arithmetic(expr, line))
        value = ev.decide(words)
        said = "`" + _short(" ".join([keyword, *words]).strip()) + "`"
        if value is None:
            return None, f"line {line}: {said} cannot be decided ({ev.why[0] if ev.why else 'not a test'})"
        reads = list(dict.fromkeys(self.env_reads[start:]))
        if reads:
            self.notes.append(f"line {line}: {said} reads {', '.join('$' + r for r in reads)}, which the file does "
                              f"not set: read as unset (as run with no such environment variable and no arguments), "
                              f"so the condition is {str(value).lower()}")
        return value, ""

    def _operand(self, raw: str, line: int) -> str:
        """A test's operand: expanded; a variable the file never sets is empty; an unknown value is Undecidable."""
        text = " ".join(split_words(self.expand(raw, line)))
        for token, u in list(self.unknown.items()):
            if token in text and u.why:
                raise Undecidable(f"{token}: {u.why}")
            if token in text:  # a variable the file never sets, read through one it does (X=$1)
                self.env_reads.append(token.strip("${}"))
                text = text.replace(token, "")
        return text

    def arithmetic(self, expr: str, line: int) -> int:
        """Integer arithmetic over the file's values, $-expansions done first (shell_eval.arithmetic: the operators;
        Undecidable where it reads a value the file does not state)."""
        text = " ".join(split_words(self.expand(expr, line)))
        for token, u in self.unknown.items():
            if token in text:
                raise Undecidable(f"{token}: {u.why or 'not set in the file'}")
        return arithmetic(text, self._scalar)

    def _scalar(self, name: str) -> str | None:
        value = self.vars.get(name)
        return value[0] if isinstance(value, list) and value else None if isinstance(value, list) else value

    def forget(self, name: str, line: int, why: str) -> None:
        """NAME is set under a branch that cannot be decided: its value is not known."""
        token = f"${name}"
        self.unknown[token] = Unknown(line, token, f"set under {why}", anywhere=True)
        self.vars[name] = token

    # ---- statements ------------------------------------------------------------------------------------------

    def assign(self, word: str, line: int) -> bool:
        """NAME=word, NAME+=word, NAME=( ... ), NAME+=( ... ); False where `word` is not an assignment."""
        m = _ASSIGN.fullmatch(word)
        if m is None:
            return False
        name, append, raw = m.groups()
        self._assign(name, bool(append), raw, line)
        value = self.vars[name]
        if (sum(map(len, value)) if isinstance(value, list) else len(value)) > MAX_VALUE_CHARS:
            raise ShellError(f"line {line}: {name}: a value over {MAX_VALUE_CHARS:,} characters -> a launch script's "
                             "values are kilobytes; this is not one the planner reads")
        return True

    def _assign(self, name: str, append: bool, raw: str, line: int) -> None:
        old = self.vars.get(name) if append else None
        if raw.startswith("(") and raw.endswith(")"):
            elements = split_words(_bounded(self.expand(raw[1:-1], line), line, name))
            before = [] if old is None else old if isinstance(old, list) else [old]
            self.vars[name] = before + elements
            return
        value = self.word(raw, line, name)
        if isinstance(old, list):  # NAME+=word on an array appends to its first element
            self.vars[name] = [(old[0] if old else "") + value] + old[1:]
        else:
            self.vars[name] = (old or "") + value

    def command(self, words: list[str], line: int) -> list[str] | None:
        """A simple command: its assignments done; the command's expanded words (None: nothing to run)."""
        if words and words[0] in _DECLARE:
            words = [w for w in words[1:] if not w.startswith("-")]
            for w in words:
                self.assign(w, line)
            return None
        n = 0
        while n < len(words) and _ASSIGN.fullmatch(words[n]):
            n += 1
        if n == len(words):  # only assignments: they set the shell's variables
            for w in words:
                self.assign(w, line)
            return None
        if words[n] == "unset":
            for name in words[n + 1:]:
                self.vars.pop(name, None)
            return None
        if words[n] in ("source", "."):
            self.notes.append(f"line {line}: `{_short(' '.join(words))}` is not read: variables it sets are not "
                              "seen")
            return None
        return self.words(words[n:], line)

    def words(self, words: list[str], line: int) -> list[str]:
        """A command's words, expanded, split and unwrapped (`eval`, `bash -c`)."""
        return self._unwrap([w for raw in words for w in split_words(self.expand(raw, line))], line)

    def _unwrap(self, words: list[str], line: int) -> list[str]:
        """The words a command runs: `eval WORDS` and `bash -c STRING` (`sh -c`) read their text again as a command,
        expanded with the variables the script has set (exported ones are the child shell's too)."""
        if words and words[0] == "eval":
            words = split_words(self.expand(" ".join(words[1:]), line))
        for k, w in enumerate(words):
            if w not in ("bash", "sh"):
                continue
            j = k + 1
            while j < len(words) and re.fullmatch(r"-[a-z]+", words[j]) and "c" not in words[j]:
                j += 1
            if j + 1 < len(words) and re.fullmatch(r"-[a-z]*c[a-z]*", words[j]):
                return words[:k] + split_words(self.expand(words[j + 1], line))
        return words


def _render(values: list[str], quoted: bool) -> str:
    """Expanded values as shell text: inside double quotes, escaped (each element one word); outside, each
    blank-separated field quoted as one word (bash splits an unquoted expansion and never re-reads its quotes)."""
    if quoted:
        return '" "'.join(v.replace("\\", "\\\\").replace('"', '\\"') for v in values)
    return " ".join(shlex.quote(f) for v in values for f in v.split())


def _short(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def _launch(line: int, words: list[str]) -> Launch | None:
    """The `*.py` file a command runs and the arguments after it, or None where it runs none."""
    if not words or words[0] in _NOT_LAUNCH:
        return None
    for i, w in enumerate(words):
        if w.endswith(".py"):
            rest = words[i + 1:]
            stop = next((j for j, r in enumerate(rest) if _OPERATOR.fullmatch(r)), len(rest))
            return Launch(line, w, rest[:stop])
    return None


def read_script(text: str) -> ShellRead:
    """The launches, commands and variables of a launch script or an argument file (see the module docstring).
    Refused: CRLF line endings (bash reads the carriage return as part of each line's last word, and a backslash before
    one continues nothing), and a quote or parenthesis left open at the end (bash stops: 'unexpected EOF')."""
    if "\r\n" in text:
        line = text.count("\n", 0, text.index("\r\n")) + 1
        raise ShellError(f"line {line}: CRLF line endings -> bash reads the carriage return as part of the line's "
                         "last word; convert the file to LF (dos2unix)")
    _refuse_unterminated(text)
    script = _Script()
    for line, stmt in statements(text):
        if script.done:
            break
        script.statement(raw_words(stmt), line)
    shell = script.shell
    env = {k: " ".join(v) if isinstance(v, list) else v for k, v in shell.vars.items()}
    return ShellRead(script.launches, script.commands, env, shell.unknown, shell.notes, script.hidden, script.stopped)


def _refuse_unterminated(text: str) -> None:
    """A quote, backquote or `$((`/`(` the file never closes: bash reads to the end of the file and stops there."""
    depth, opened = 0, 1
    for m in _PIECE.finditer(text):
        kind, piece = m.lastgroup, m.group()
        closes = {"single": "'", "double": '"', "back": "`"}.get(kind or "")
        if closes and (len(piece) < 2 or not piece.endswith(closes) or piece.endswith("\\" + closes)):
            line = text.count("\n", 0, m.start()) + 1
            raise ShellError(f"line {line}: {piece[0]} opened and never closed -> bash stops at the end of the file "
                             "('unexpected EOF'); close it")
        if kind == "open":
            depth, opened = depth + 1, (opened if depth else text.count("\n", 0, m.start()) + 1)
        elif kind == "close":
            depth = max(0, depth - 1)
    if depth:
        raise ShellError(f"line {opened}: ( opened and never closed -> bash stops at the end of the file ('unexpected "
                         "EOF'); close it")


RUN, SKIP, UNKNOWN = "run", "skip", "unknown"


@dataclass
class _Block:
    """An if / loop / case / function / { } block: the mode around it, the mode of the branch being read, whether a
    branch was taken (an if), and why the branch read is unknown (an undecided condition, a loop)."""

    kind: str
    outer: str
    mode: str
    taken: bool = False
    why: str = ""


@dataclass
class _Script:
    """The statements of a script, read in order under the blocks that hold them (module docstring: the policy)."""

    shell: _Shell = field(default_factory=_Shell)
    blocks: list[_Block] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)
    stopped: str = ""
    done: bool = False
    undecided: str = ""  # why the last test of a list could not be decided

    def mode(self) -> tuple[str, str]:
        return (self.blocks[-1].mode, self.blocks[-1].why) if self.blocks else (RUN, "")

    def statement(self, words: list[str], line: int) -> None:
        while len(words) > 1 and words[0] in ("then", "do", "else", "{"):  # `then CMD`: the keyword, then the command
            self.statement(words[:1], line)
            words = words[1:]
        if not words:
            return
        head = words[0]
        if head in ("if", "elif", "else", "fi"):
            self._if(head, words[1:], line)
        elif head in ("for", "while", "until", "select", "case"):
            self._loop(head, words, line)
        elif head in ("done", "esac"):
            self._close(("loop",))
        elif _FUNCTION.fullmatch(" ".join(words)):
            self._open("function", UNKNOWN, f"line {line}: the body of `{words[0]}`, run only where it is called")
        elif head in ("{", "}"):
            self._open("group", *self.mode()) if head == "{" else self._close(("group", "function"))
        elif head not in ("then", "do"):
            self._list(words, line)

    def _open(self, kind: str, mode: str, why: str = "") -> None:
        outer = self.mode()[0]
        mode = SKIP if SKIP in (outer, mode) else UNKNOWN if UNKNOWN in (outer, mode) else RUN
        self.blocks.append(_Block(kind, outer, mode, why=why or self.mode()[1]))

    def _close(self, kinds: tuple[str, ...]) -> None:
        while self.blocks:
            if self.blocks.pop().kind in kinds:
                return

    def _if(self, head: str, condition: list[str], line: int) -> None:
        """if / elif / else / fi: a branch is read where its condition holds and no branch before it was taken."""
        if head == "if":
            self.blocks.append(_Block("if", self.mode()[0], SKIP, why=self.mode()[1]))
        if not self.blocks or self.blocks[-1].kind != "if":
            return
        block = self.blocks[-1]
        if head == "fi":
            self.blocks.pop()
        elif block.outer != RUN or block.taken:  # inside a skipped or unknown branch, or past the taken one
            block.mode = block.outer if block.outer == UNKNOWN else SKIP
        else:
            value, why = (True, "") if head == "else" else self.shell.decide(head, condition, line)
            block.mode = RUN if value else SKIP if value is False else UNKNOWN
            block.taken = value is not False
            if value is None:
                block.why = why
                block.outer = UNKNOWN  # the branches after an undecided one are as unknown

    def _loop(self, head: str, words: list[str], line: int) -> None:
        """Loops and `case` are not run: their bodies are unknown (module docstring), except `for X in "$@"`, which
        runs once per script argument: never, for a script read as run without arguments."""
        no_args = head == "for" and len(words) >= 4 and words[2] == "in" and words[3].strip('"') in ("$@", "$*")
        what = "a `case`" if head == "case" else f"a `{head}` loop"
        self._open("loop", SKIP if no_args else UNKNOWN, f"line {line}: inside {what}, which the planner does not run")

    def _list(self, words: list[str], line: int) -> None:
        """A list `a && b || c`: each command runs where the ones before let it; a test is decided, any other command
        is taken to succeed (lists guard errors: `mkdir -p D || exit 1`, `cd D && torchrun ...`)."""
        status: bool | None = True
        mode, why = self.mode()
        for op, part in split_list(words):
            skipped = bool(op) and status is not None and (op == "&&") != status
            if op and status is None and mode == RUN:
                mode, why = UNKNOWN, self.undecided
            if part == ["{"]:  # `cmd || {`: a group, closed by `}`
                self._open("group", SKIP if skipped else mode, why)
                return
            if not skipped:
                status = self._simple(part, line, mode, why)

    def _simple(self, words: list[str], line: int, mode: str, why: str) -> bool | None:
        """One command under `mode`; its status (True: taken to succeed; a test: its value)."""
        if mode == SKIP or not words:
            return True
        if words[0] in ("[", "[[", "test", "!") or words[0].startswith("(("):
            if mode != RUN:
                return None
            value, self.undecided = self.shell.decide("", words, line)
            return value
        if mode == UNKNOWN:
            self._unknown_command(words, line, why)
            return None
        if words[0] in ("true", ":", "false"):  # `false && X=4` leaves X alone
            return words[0] != "false"
        if words[0] == "exit":
            code = self.shell.word(words[1], line) if len(words) > 1 else "0"
            self.done = True
            self.stopped = "" if code == "0" else f"line {line}: `{_short(' '.join(words))}`"
            return True
        self._run(words, line)
        return True

    def _run(self, words: list[str], line: int) -> None:
        ran = self.shell.command(words, line)
        if ran is None:
            return
        found = _launch(line, ran)
        if found is not None:
            self.launches.append(found)
        elif ran and ran[0] not in ("echo", "printf"):
            self.commands += ran

    def _unknown_command(self, words: list[str], line: int, why: str) -> None:
        """A command in a branch that cannot be decided: the variables it assigns become unknown; a launch in it is
        recorded (refused if the script launches nowhere else)."""
        for w in words:
            m = _ASSIGN.fullmatch(w)
            if m:
                self.shell.forget(m.group(1), line, why)
        if words[0] == "unset":
            for name in words[1:]:
                self.shell.forget(name, line, why)
        if _launch(line, self.shell.words(words, line)) is not None:
            self.hidden.append(f"line {line}: `{_short(' '.join(words))}` ({why})")


_FUNCTION = re.compile(r"(?:function\s+[\w.:-]+(?:\s*\(\s*\))?|[\w.:-]+\s*\(\s*\))\s*\{?")


def unexpanded(words: list[str], unknown: dict[str, Unknown]) -> list[str]:
    """The variables the file never sets that `words` still hold, as `$NAME`."""
    return sorted({"$" + token.strip("${}") for token, u in unknown.items() if not u.why
                   for w in words if token in w})


def refusals(words: list[str], unknown: dict[str, Unknown], reads: set[str]) -> list[str]:
    """Problems for the options in `reads` whose value is a word the planner cannot know (`--opt VALUE` or
    `--opt=VALUE`, VALUE an unexpanded variable or construct; a value with a known part, such as a path, is left to
    the option's own reading)."""
    problems = [f"{token}: {u.why} -> state it in the file outside the branch (set the value the condition tests), "
                "or pass the expanded arguments (e.g. run the script with `set -x`)"
                for token, u in unknown.items() if u.anywhere and any(token in w for w in words)]
    for i, tok in enumerate(words):
        option, eq, value = tok.partition("=")
        if not eq:
            value = words[i + 1] if i + 1 < len(words) else ""
        if option in reads and value in unknown and not unknown[value].anywhere:
            problems.append(_refusal(option, value, unknown[value]))
    return problems


def _refusal(option: str, value: str, u: Unknown) -> str:
    name = value.strip("${}")
    if not u.why and name.isdigit():
        return (f"{option} {value}: the script's argument ${name}, unset when the script is read as run without "
                "arguments -> write the value in the file, or pass the expanded arguments")
    if not u.why:  # a variable the file never sets
        return (f"{option} {value}: an unexpanded shell variable -> define {name} in the file, or pass the expanded "
                "arguments (e.g. run the script with `set -x`, or envsubst)")
    return (f"{option} {value}: line {u.line}: {u.why} -> set a value the file states, or pass the expanded "
            "arguments (e.g. run the script with `set -x`)")
