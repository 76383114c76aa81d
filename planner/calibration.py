"""Apply a `planner calibrate` file: measured compute and link figures replace the catalog's (no torch here)."""

from __future__ import annotations

from pathlib import Path

from cluster_specs import ClusterSpec, SpecError, load_cluster
from cluster_specs.schema import CALIBRATION_KNOB_RANGES

KNOB_NAMES = frozenset(CALIBRATION_KNOB_RANGES)  # the knobs a calibration file sets (their ranges: checked on load)


def calibration_knobs(cluster: ClusterSpec) -> dict:
    if cluster.measured is None:
        return {}
    return {k: v for k, v in cluster.measured.knobs.items() if k in KNOB_NAMES}


def apply_calibration(cluster: ClusterSpec, path: Path) -> tuple[ClusterSpec, dict]:
    """The target cluster with the calibrated GPU (peak, matmul efficiency, memory bandwidth) and intra-node link
    of the file; its nodes, network between nodes and node count stay. Returns (cluster, knobs)."""
    cal = load_cluster(str(path))
    if cal.measured is None:
        raise SpecError("not a calibration file (no 'measured' section; write one with `planner calibrate`)",
                        source=str(path))
    data = cluster.model_dump(mode="json")
    data["gpu"] = cal.gpu_spec().model_dump(mode="json")
    if cal.gpus_per_node == cluster.gpus_per_node:
        data["intra_node"] = cal.intra_node.model_dump(mode="json")
    data["measured"] = cal.measured.model_dump(mode="json")
    return ClusterSpec.model_validate(data), calibration_knobs(cal)


def calibrated(cluster: ClusterSpec, calibration: Path | None) -> tuple[ClusterSpec, dict]:
    """The one merge: a cluster file written by `planner calibrate` carries its fitted knobs; a --calibration file
    replaces the GPU and intra-node figures (and brings its knobs). Returns (cluster, knob overrides)."""
    if calibration is None:
        return cluster, calibration_knobs(cluster)
    return apply_calibration(cluster, calibration)


def write_calibration_file(path: Path, spec: dict) -> None:
    """Write what `planner calibrate` measured as a cluster file, and check it loads back as one."""
    import yaml

    from planner.fileio import write_atomically

    text = "# Written by `planner calibrate`: this machine, measured. Use as --cluster FILE or --calibration FILE.\n"
    write_atomically(path, text + yaml.safe_dump(spec, sort_keys=False))
    load_cluster(str(path))
