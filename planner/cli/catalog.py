"""`planner clusters list|show`, `planner models list|show`."""

from __future__ import annotations

from planner.cli.app import clusters_app, models_app
from planner.cli.options import JsonOpt, NodesOpt, emit_json, stdout


@clusters_app.command("list")
def clusters_list(as_json: JsonOpt = False) -> None:
    """List the cluster presets."""
    from cluster_specs import cluster_names, load_cluster
    from planner.explain import catalog

    specs = [load_cluster(n) for n in cluster_names()]
    emit_json(catalog.clusters_doc(specs)) if as_json else catalog.render_clusters(stdout(), specs)


@clusters_app.command("show")
def clusters_show(name: str, nodes: NodesOpt = None, as_json: JsonOpt = False) -> None:
    """Show a cluster preset or file, with derived totals."""
    from cluster_specs import load_cluster
    from planner.explain import catalog

    spec = load_cluster(name, nodes=nodes)
    emit_json(catalog.cluster_doc(spec)) if as_json else catalog.render_cluster(stdout(), spec)


@models_app.command("list")
def models_list(as_json: JsonOpt = False) -> None:
    """List the model presets with their derived parameter counts."""
    from planner.explain import catalog
    from planner.inputs.models import load_model, model_names

    specs = [load_model(n) for n in model_names()]
    emit_json(catalog.models_doc(specs)) if as_json else catalog.render_models(stdout(), specs)


@models_app.command("show")
def models_show(name: str, as_json: JsonOpt = False) -> None:
    """Show a model (preset, spec file, HF config.json or snapshot directory) and its parameters per part."""
    from planner.explain import catalog
    from planner.inputs.models import load_model

    spec = load_model(name)
    emit_json(catalog.model_doc(spec)) if as_json else catalog.render_model(stdout(), spec)
