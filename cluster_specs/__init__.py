"""Cluster and GPU specs: the schema, the shipped GPU catalog and the cluster presets."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from cluster_specs.errors import SpecError, from_pydantic, unknown_name
from cluster_specs.reading import read_structured_file
from cluster_specs.schema import ClusterSpec, GPUSpec

__all__ = ["ClusterSpec", "GPUSpec", "SpecError", "load_gpu", "gpu_names", "cluster_names", "load_cluster",
           "read_structured_file"]


@functools.cache
def _catalog() -> dict:
    import yaml

    text = resources.files("cluster_specs").joinpath("gpus.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def gpu_names() -> list[str]:
    return sorted(_catalog())


@functools.cache
def load_gpu(name: str) -> GPUSpec:
    catalog = _catalog()
    key = {k.lower(): k for k in catalog}.get(name.lower())
    if key is None:
        raise unknown_name("GPU", name, list(catalog))
    return GPUSpec.model_validate({"name": key, **catalog[key]})


@functools.cache
def _names() -> tuple[str, ...]:
    folder = resources.files("cluster_specs").joinpath("clusters")
    return tuple(sorted(f.name[:-5] for f in folder.iterdir() if f.name.endswith(".yaml")))


def cluster_names() -> list[str]:
    return list(_names())


def _validate_cluster(data, source: str) -> ClusterSpec:
    from pydantic import ValidationError

    if not isinstance(data, dict):
        raise SpecError(f"expected a mapping of cluster fields, got {type(data).__name__}", source=source)
    try:
        spec = ClusterSpec.model_validate(data)
        spec.gpu_spec()  # resolve the catalog name now, so an unknown GPU is an input error
    except ValidationError as exc:
        raise from_pydantic(exc, source=source) from None
    except SpecError as exc:
        raise SpecError([f"gpu: {p}" for p in exc.problems], source=source) from None
    return spec


@functools.cache
def _preset(name: str) -> ClusterSpec:
    """A built-in preset, parsed and validated once per process (the spec is frozen, so sharing it is safe; a
    `compare` or `check` of several files loads the same presets again and again)."""
    import yaml

    text = resources.files("cluster_specs").joinpath("clusters", f"{name}.yaml").read_text("utf-8")
    return _validate_cluster(yaml.safe_load(text), f"cluster preset {name}")


def load_cluster(name_or_path: str, *, nodes: int | None = None) -> ClusterSpec:
    """A preset by name, or a YAML/JSON file by path; `nodes` scales it."""
    path = Path(name_or_path)
    if name_or_path in cluster_names():
        spec = _preset(name_or_path)
    elif path.suffix.lower() in (".yaml", ".yml", ".json") or path.exists():
        spec = _validate_cluster(read_structured_file(path), str(path))
    else:
        raise unknown_name("cluster", name_or_path, cluster_names())
    if nodes is not None:
        if nodes < 1:
            raise SpecError(f"--nodes: {nodes} -> must be >= 1")
        from pydantic import ValidationError

        try:
            spec = spec.with_nodes(nodes)
        except ValidationError as exc:
            raise from_pydantic(exc, source=f"{spec.name} x {nodes} nodes") from None
    return spec
