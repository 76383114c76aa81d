"""`clusters` and `models`: their JSON documents and their terminal tables (full preset names, never cut)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from planner.explain.report import count, kv_table


def clusters_doc(specs: list):
    from planner.contract import ClusterList, ClusterListEntry

    return ClusterList([ClusterListEntry(name=s.name, description=s.description, gpu=s.gpu,
                                         gpus_per_node=s.gpus_per_node) for s in specs])


def render_clusters(console: Console, specs: list) -> None:
    table = Table(title="Cluster presets (scale any with --nodes N)", title_justify="left")
    table.add_column("name", no_wrap=True, min_width=max(len(s.name) for s in specs))  # the name one must type
    table.add_column("GPU", no_wrap=True, min_width=max(len(str(s.gpu)) for s in specs))
    for col in ("per node", "inside a node", "between nodes"):
        table.add_column(col)  # wrapped at spaces
    for s in specs:
        net = s.inter_node
        table.add_row(s.name, str(s.gpu), str(s.gpus_per_node), f"{s.intra_node.kind} {s.intra_node.gb_per_s:g} GB/s",
                      f"{net.nics_per_node} x {net.nic_gbit_per_s:g} Gb/s {net.kind}" if net.nics_per_node else "-")
    console.print(table)


def cluster_doc(spec):
    from planner.contract import ClusterDocument

    return ClusterDocument.from_spec(spec)


def render_cluster(console: Console, spec) -> None:
    gpu, net = spec.gpu_spec(), spec.inter_node
    console.print(kv_table(f"{spec.name}: {spec.description}", [
        ("GPUs", f"{spec.num_nodes} nodes x {spec.gpus_per_node} {gpu.name} = {spec.num_gpus}"),
        ("GPU memory", f"{gpu.memory_gib:g} GiB"),
        ("dense peak", ", ".join(f"{k} {v:g} TFLOP/s" for k, v in gpu.tflops.items())),
        ("inside a node", f"{spec.intra_node.kind}, {spec.intra_node.gb_per_s:g} GB/s per GPU per direction "
                          f"(x{spec.intra_node.efficiency:g} achievable)"),
        ("between nodes", f"{net.nics_per_node} x {net.nic_gbit_per_s:g} Gb/s {net.kind} (x{net.efficiency:g})"
         if net.nics_per_node else "none"),
        ("host memory", f"{spec.host_memory_gib:g} GiB per node"),
    ]))


def models_doc(specs: list):
    from planner.contract import ModelList, ModelListEntry

    return ModelList([ModelListEntry(name=s.name, parameters=s.parameter_counts()["total"], source=s.source)
                      for s in specs])


def render_models(console: Console, specs: list) -> None:
    table = Table(title="Model presets", title_justify="left")
    table.add_column("name", no_wrap=True, min_width=max(len(s.name) for s in specs))
    for col in ("parameters", "layers", "hidden", "heads (kv)", "vocab"):
        table.add_column(col, overflow="fold")
    for s in specs:
        table.add_row(s.name, count(s.parameter_counts()["total"]), str(s.num_layers), str(s.hidden_size),
                      f"{s.num_attention_heads} ({s.kv_heads})", str(s.vocab_size))
    console.print(table)


def model_doc(spec):
    from planner.contract import ModelDocument

    return ModelDocument.from_spec(spec)


def render_model(console: Console, spec) -> None:
    counts = spec.parameter_counts()
    rows = [("parameters", f"{counts['total']:,} ({counts['total'] / 1e9:.2f}e9)"),
            ("shape", f"{spec.num_layers} layers, h={spec.hidden_size}, {spec.num_attention_heads} heads "
                      f"({spec.kv_heads} KV), ffn={spec.ffn}, vocab={spec.vocab_size}"),
            ("kind", f"{spec.mlp} MLP, {spec.norm}, {spec.attention} attention, {spec.position_embedding} positions, "
                     f"{'tied' if spec.tied_embeddings else 'untied'} embeddings")]
    rows += [(k.replace("_", " "), count(v)) for k, v in counts.items() if k != "total"]
    if spec.source:
        rows.append(("source", spec.source))
    console.print(kv_table(spec.name, rows))
