"""The guarded file reader: every loader refuses what would crash, hang or exhaust memory, with one clear line."""

import os
import time

import pytest

from cluster_specs import SpecError, load_cluster
from cluster_specs.reading import (
    MAX_DEPTH,
    InputIOError,
    parse_json,
    parse_toml,
    parse_yaml,
    read_structured_file,
    read_text,
)
from planner.errors import exit_code_for
from planner.inputs.models import load_model

BOMB = "\n".join(
    [f"a0: &a0 [{', '.join(['lol'] * 9)}]"]
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
)


def test_alias_bomb_is_refused_fast():
    t = time.perf_counter()
    with pytest.raises(SpecError, match="alias bomb"):
        parse_yaml(BOMB, "bomb.yaml")
    assert time.perf_counter() - t < 2.0  # 9 levels x 9 aliases = 387M nodes if expanded


def test_a_few_aliases_are_fine():
    assert parse_yaml("base: &b {x: 1}\nother: *b\n", "f.yaml") == {"base": {"x": 1}, "other": {"x": 1}}


def test_recursive_alias_is_refused():
    with pytest.raises(SpecError, match="recursive alias"):
        parse_yaml("a: &a [*a]\n", "f.yaml")


@pytest.mark.parametrize("parse, text", [
    (parse_json, "[" * 5000 + "]" * 5000),
    (parse_json, "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)),
    (parse_yaml, "[" * 5000 + "]" * 5000),
    (parse_toml, "a = " + "[" * 5000 + "]" * 5000),
])
def test_deep_nesting_is_refused(parse, text):
    with pytest.raises(SpecError, match="nested more than 64"):
        parse(text, "deep")


def test_nesting_at_the_limit_is_read():
    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "ok") is not None


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_devices_are_refused_without_reading(device):
    with pytest.raises(SpecError, match="character device"):
        read_text(device)


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "cluster.yaml"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="FIFO"):
        load_cluster(str(fifo))


def test_size_cap(tmp_path, monkeypatch):
    import cluster_specs.reading as reading

    f = tmp_path / "big.yaml"
    f.write_text("a: 1\n" * 100)
    monkeypatch.setattr(reading, "MAX_FILE_BYTES", 100)
    with pytest.raises(SpecError, match="larger than the 100-byte limit"):
        reading.read_text(f, max_bytes=100)


def test_bom_is_accepted_and_binary_is_named(tmp_path):
    f = tmp_path / "m.json"
    f.write_bytes(b"\xef\xbb\xbf" + b'{"num_layers": 2}')
    assert read_structured_file(f) == {"num_layers": 2}
    f.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    with pytest.raises(SpecError, match="binary file"):
        read_structured_file(f)
    f.write_bytes(b'{"a": "\xff\xfe"}')
    with pytest.raises(SpecError, match="not UTF-8"):
        read_structured_file(f)


def test_permission_denied_is_an_io_error(tmp_path, monkeypatch):
    f = tmp_path / "c.yaml"
    f.write_text("a: 1\n")

    def deny(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("builtins.open", deny)
    with pytest.raises(InputIOError, match="Permission denied") as info:
        read_text(f)
    assert exit_code_for(info.value) == 8
    assert exit_code_for(SpecError("x")) == 3


def test_hf_snapshot_directory_reads_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, '
        '"intermediate_size": 128, "vocab_size": 100}')
    assert load_model(str(tmp_path)).num_layers == 2
    (tmp_path / "config.json").unlink()
    with pytest.raises(SpecError, match="without config.json"):
        load_model(str(tmp_path))
