"""The one guarded file reader every loader uses (cluster, model, HF config, plan JSON, DeepSpeed JSON,
torchtitan TOML, Megatron arguments, validation rows).

Limits, each with its reason:
- regular files only: /dev/zero, /dev/urandom and FIFOs never end (or block), a directory is not a file;
- MAX_FILE_BYTES (16 MiB): the largest real input is a plan JSON of ~100 KiB; 16 MiB leaves 100x room and
  keeps a mistaken path (a checkpoint, a log) from being read into memory;
- UTF-8, with or without a byte-order mark (Windows editors write one); anything else is called binary;
- MAX_DEPTH (64) levels of nesting: real configs nest < 10 deep; deeper input would exhaust Python's
  recursion (json, tomllib and PyYAML's composer are recursive);
- MAX_YAML_NODES (1,000,000) nodes after aliases are expanded: anchors and aliases are legitimate, but nine
  nested aliases of nine can describe 9^9 nodes (the "billion laughs"); counting stops the bomb before anything
  walks it. Recursive aliases (`&a [*a]`) are refused.

Every failure is a SpecError naming the file: exit 3 for bad content, exit 8 (InputIOError) when the
operating system could not read it.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cluster_specs.errors import SpecError
from planner.errors import ExitCode

MAX_FILE_BYTES = 16 * 2**20
MAX_DEPTH = 64
MAX_YAML_NODES = 1_000_000
BOM = b"\xef\xbb\xbf"


class InputIOError(SpecError):
    """The file exists (or should) but the operating system would not let us read it."""

    exit_code = ExitCode.IO


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_bytes(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The file's bytes, after checking that it is a regular file of at most `max_bytes`."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise SpecError("no such file", source=str(p)) from None
    except OSError as exc:
        raise InputIOError(f"cannot read file: {exc.strerror or exc}", source=str(p)) from None
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(f"is {_kind(st.st_mode)}, not a regular file", source=str(p))
    if st.st_size > max_bytes:
        raise SpecError(f"{st.st_size:,} bytes -> larger than the {max_bytes:,}-byte limit for an input file",
                        source=str(p))
    try:
        with open(p, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise InputIOError(f"cannot read file: {exc.strerror or exc}", source=str(p)) from None
    if len(data) > max_bytes:  # grew after stat
        raise SpecError(f"larger than the {max_bytes:,}-byte limit for an input file", source=str(p))
    return data


def decode_text(data: bytes, source: str) -> str:
    """UTF-8 with an optional byte-order mark; NUL bytes or invalid UTF-8 -> a 'binary file' error."""
    if data.startswith(BOM):
        data = data[len(BOM):]
    if b"\x00" in data:
        at = data.index(b"\x00")
        raise SpecError(f"binary file (NUL byte at offset {at}), expected UTF-8 text", source=source)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"not UTF-8 text (invalid byte at offset {exc.start}); binary file?", source=source) from None


def read_text(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES) -> str:
    return decode_text(read_bytes(path, max_bytes=max_bytes), str(path))


def nesting_depth(doc) -> int:
    """Deepest nesting of dicts/lists, computed without recursion."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            return depth
        stack.extend((c, depth + 1) for c in children)
    return deepest


def check_depth(doc, source: str, what: str):
    depth = nesting_depth(doc)
    if depth > MAX_DEPTH:
        raise SpecError(f"{what} nested more than {MAX_DEPTH} levels deep -> refused (real configs nest < 10)",
                        source=source)
    return doc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def parse_json(text: str, source: str):
    try:
        doc = json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise SpecError(f"JSON nested more than {MAX_DEPTH} levels deep -> refused", source=source) from None
    except SpecError as exc:
        raise SpecError(exc.problems, source=source) from None
    except ValueError as exc:  # JSONDecodeError, and int strings over Python's digit limit
        raise SpecError(f"malformed JSON: {_first_line(exc)}", source=source) from None
    return check_depth(doc, source, "JSON")


def _unique_keys(pairs: list) -> dict:
    """A JSON object whose keys are all different: a repeated key is refused, not silently won by its last value."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise SpecError(f"{key}: given twice in one object -> give each key once")
        out[key] = value
    return out


def parse_toml(text: str, source: str):
    import tomllib

    try:
        doc = tomllib.loads(text)
    except RecursionError:
        raise SpecError(f"TOML nested more than {MAX_DEPTH} levels deep -> refused", source=source) from None
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise SpecError(f"malformed TOML: {_first_line(exc)}", source=source) from None
    return check_depth(doc, source, "TOML")


def _guarded_loader():
    import yaml

    class GuardedLoader(yaml.SafeLoader):
        """PyYAML's safe loader with a nesting limit while composing (before anything recurses deeply)."""

        depth = 0

        def compose_node(self, parent, index):
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    raise SpecError(f"YAML nested more than {MAX_DEPTH} levels deep -> refused")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node, deep=False):
            # a repeated key is refused (PyYAML keeps the last value silently); merge keys (<<) may repeat
            if isinstance(node, yaml.MappingNode):
                seen = set()
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = key_node.value
                    if key in seen:
                        raise SpecError(f"{key}: given twice in one mapping (line {key_node.start_mark.line + 1}) "
                                        "-> give each key once")
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return GuardedLoader


def expanded_yaml_nodes(root) -> int:
    """Nodes in the document once every alias is expanded (shared subtrees counted once per use).

    Memoised on node identity, so a bomb is measured in time linear in its text; a cycle raises ValueError."""
    import yaml

    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            kids = _children(node, yaml)
            sizes[key] = min(1 + sum(sizes[id(k)] for k in kids), MAX_YAML_NODES + 1)
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise ValueError("recursive alias")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node, yaml) if id(k) not in sizes)
    return sizes[id(root)]


def _children(node, yaml) -> list:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    return []


def parse_yaml(text: str, source: str):
    try:
        return _compose_and_construct(text, source)
    except SpecError as exc:
        raise SpecError(exc.problems, source=source) from None
    except RecursionError:
        raise SpecError(f"YAML nested more than {MAX_DEPTH} levels deep -> refused", source=source) from None
    except Exception as exc:  # yaml.YAMLError, and PyYAML's odd value errors (e.g. huge timestamps)
        raise SpecError(f"malformed YAML: {_first_line(exc)}", source=source) from None


def _compose_and_construct(text: str, source: str):
    loader = _guarded_loader()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            n = expanded_yaml_nodes(node)
        except ValueError:
            raise SpecError("YAML alias refers to itself (recursive alias) -> refused") from None
        if n > MAX_YAML_NODES:
            raise SpecError(f"YAML expands to more than {MAX_YAML_NODES:,} nodes through aliases (an alias bomb?) "
                            "-> refused")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_structured_file(path: str | Path):
    """A YAML or JSON file (by suffix; anything not .json is read as YAML, a superset of JSON), guarded."""
    p = Path(path)
    text = read_text(p)
    if p.suffix.lower() == ".json":
        return parse_json(text, str(p))
    return parse_yaml(text, str(p))
