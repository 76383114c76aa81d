"""`planner check`: validate existing configs against a model and a cluster, for CI.

Each config is read with its framework's defaults (planner/integrations/readers.py), then checked: the
framework's own start-up refusals, the layout rules (planner/inputs/specs.py), the framework's vocabulary rule,
the model the config describes against --model, and the predicted memory. One line per violation with the
numbers and a fix hint. Exit: 0 pass, 1 violation, 3 could not check (the worst over several files wins: 3 > 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cluster_specs import SpecError
from cost_models.inputs import Precision
from planner.frameworks import Framework
from planner.frameworks.capabilities import capabilities
from planner.inputs.specs import LayoutSpec

if TYPE_CHECKING:
    from cost_models.step import StepEstimate
    from planner.problem import Problem
from planner.integrations.exports import with_fields
from planner.integrations.readers import (  # noqa: F401  (megatron_parser: the option names, for tests and exports)
    HIDDEN_SQUARED,
    ConfigView,
    megatron_parser,
    megatron_resolve,
    read_config,
    torchtitan_resolve,
)
from planner.rules import layout_violations

GIB = 2**30

HINTS = [
    ("dp*tp*pp", "choose degrees whose product is the number of GPUs"),
    ("num_attention_heads", "use a tp that divides the heads"),
    ("num_kv_heads", "use a tp that divides the KV heads, or a multiple of them"),
    ("ffn_hidden_size", "use a tp that divides the FFN size"),
    ("hidden_size", "use a tp that divides the hidden size"),
    ("exceeds the", "keep tp <= GPUs per node; add pp or dp instead"),
    ("gpus_per_node", "use a tp that divides the GPUs of a node"),
    ("num_layers", "use fewer pipeline stages (or virtual stages), or a layer count they divide"),
    ("global_batch_size", "set global batch = micro-batch x micro-batches (gradient accumulation) x dp"),
    ("sequence_parallel", "turn sequence parallelism off or use a tp that divides the sequence"),
    ("virtual_stages", "use interleaved_1f1b with >= 2 virtual stages, or drop them"),
    ("num_micro_batches", "use a multiple of pp micro-batches"),
    ("zero_stage", "use ZeRO-1 (distributed optimizer) with pipelining"),
    ("offload", "offload needs a ZeRO stage that shards what is offloaded"),
    ("layers_per_stage", "list one layer count per stage, summing to the layers"),
    ("vocab", "pick a tp that divides the vocabulary, or a framework that pads it (Megatron: 128 x tp)"),
]
# violations after which a layout has no meaningful prediction (the degrees, the split or the chunks do not hold):
# the estimate is skipped rather than run on a layout the cost model's preconditions exclude
STRUCTURAL = frozenset({"dp*tp*pp", "dp*tp*pp*cp", "tp", "cp", "cp_comm", "ep", "etp", "ep*etp", "pp*virtual_stages",
                        "virtual_stages", "num_layers", "num_micro_batches", "schedule", "field", "layers_per_stage",
                        "recompute_layers_per_stage"})
MODEL_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size")


def hint_for(problem: str) -> str:
    for key, hint in HINTS:
        if problem.startswith(key) or key in problem.split("->")[0]:
            return hint
    return "see the message"


@dataclass
class Outcome:
    layout: LayoutSpec | None
    violations: list[dict]
    estimate: StepEstimate | None
    notes: list[str]
    problem: Problem


def resolve(view: ConfigView, num_layers: int, overrides: dict) -> dict:
    """The layout fields once the model is known: framework-specific splits, then --fix/--tp/--pp overrides."""
    if view.framework is Framework.TORCHTITAN:
        torchtitan_resolve(view, num_layers)
    elif view.framework in (Framework.MEGATRON, Framework.MEGATRON_DEEPSPEED, Framework.NEMO):
        megatron_resolve(view, num_layers)
    fields = dict(view.fields)
    if fields.get("schedule") == "interleaved_1f1b" and view.layers_per_chunk and view.framework is Framework.GENERIC:
        fields["virtual_stages"] = max(1, num_layers // (fields["pp"] * view.layers_per_chunk))
    fields.update(overrides)
    return fields


def _model_mismatch(view: ConfigView, model) -> list[dict]:
    out = []
    said = dict(view.model)
    said.pop("dropout", None)  # a note, not a different model (dropout_note)
    flavor = said.pop("flavor", None)
    from planner.integrations.exports import TORCHTITAN_FLAVORS

    shipped = TORCHTITAN_FLAVORS.get(model.name, ("", ""))[1].lower()
    if flavor and str(flavor).lower() not in (model.name.lower(), model.name.split("-")[-1].lower(), shipped):
        out.append(f"model flavor {flavor!r} (--model {model.name})")
    for key in MODEL_KEYS:
        if key in said and said[key] != getattr(model, "kv_heads" if key == "num_kv_heads" else
                                                 "ffn" if key == "ffn_hidden_size" else key):
            ours = getattr(model, "kv_heads" if key == "num_kv_heads" else "ffn" if key == "ffn_hidden_size" else key)
            out.append(f"{key} {said[key]} (--model {model.name}: {ours})")
    if not out:
        return []
    msg = f"model: the config describes a different model: {'; '.join(out)} -> checked against --model {model.name}"
    return [{"rule": "model", "message": msg, "hint": "pass the --model the config trains (a preset or a model file)"}]


def _dropout_note(view: ConfigView, model) -> None:
    """The config's dropout where it differs from the model's: the masks dropout saves are memory the prediction,
    made for --model's dropout, counts or leaves out."""
    runs = view.model.get("dropout")
    if runs is None or runs == model.dropout:
        return
    if runs:
        view.notes.append(f"the config runs dropout (Megatron's default is 0.1 for attention and hidden) where --model "
                          f"{model.name} has none: its masks are memory this check does not count; set "
                          "--attention-dropout 0.0 --hidden-dropout 0.0, as export writes for such a model")
    else:
        view.notes.append(f"the config turns dropout off where --model {model.name} has it: this check counts its masks")


def check(view: ConfigView, problem, *, overrides: dict | None = None, allow_tp_across_nodes: bool = False,
          framework: str | None = None) -> Outcome:
    """Read-time refusals, layout rules, vocabulary, model agreement, memory."""
    from pydantic import ValidationError

    caps = capabilities(framework or view.framework)
    if view.engine_knobs and caps.framework is not view.framework:
        _other_engine(view, caps.framework)
    problem = _config_knobs(view, problem)
    fields = resolve(view, problem.model.num_layers, overrides or {})  # may add the framework's split refusals
    violations = [{"rule": r, "message": m, "hint": h} for r, m, h in view.errors]
    violations += _model_mismatch(view, problem.model)
    _dropout_note(view, problem.model)
    try:
        layout = LayoutSpec.model_validate(fields)
    except ValidationError as exc:
        from cluster_specs.errors import from_pydantic

        for line in from_pydantic(exc).problems:
            violations.append({"rule": "field", "message": line, "hint": "use an allowed value"})
        return Outcome(None, violations, None, view.notes, problem)
    for v in layout_violations(layout, problem.model, problem.training, problem.cluster,
                               allow_tp_across_nodes=allow_tp_across_nodes):
        if v.field == "global_batch_size" and any(x["rule"] == v.field for x in violations):
            continue  # the reader already said it with the framework's own arithmetic
        violations.append({"rule": v.field, "message": str(v), "hint": v.fix})
    vocab = caps.vocab_problem(problem.model.vocab_size, layout.tp)
    if vocab:
        violations.append({"rule": "vocab_size", "message": vocab, "hint": hint_for("vocab")})
    why = caps.refusal(layout.model_dump())
    # a framework's own config was read with its rules (its refusals are read-time errors); a plan JSON was not:
    # a plan made before a rule existed, or edited by hand, is checked against its framework too
    if why and (caps.framework is not view.framework or view.format == "plan"):
        violations.append({"rule": "framework", "message": why, "hint": f"plan with --framework {caps.framework.value}"})
    compiled = caps.compile_problem(problem.training.compile)  # a hand-edited plan: compile for a stack without it
    if compiled:
        violations.append({"rule": "compile", "message": compiled, "hint": "remove inputs.training.compile, or plan "
                           "for torchtitan"})
    states = caps.state_zero_problem(problem.training, layout.zero_stage)
    if states:
        violations.append({"rule": "optimizer_states", "message": states,
                           "hint": "use the distributed optimizer (ZeRO-1), or keep fp32 states"})
    est = None
    if not any(v["rule"] in STRUCTURAL for v in violations):
        est, run_problem = _estimate(problem, layout, violations)
        _memory(run_problem, layout, est, violations, view.remedy_names)
    return Outcome(layout, violations, est, view.notes, problem)


CONFIG_SETTING_KNOBS = frozenset({"zero3_max_reuse_distance", "zero3_reduce_bucket_elements", "reduce_bucket_elements",
                                  "grad_all_reduce_zero_stages", "grad_slice_reduce_zero_stages",
                                  "zero0_optimizer", "zero0_pipeline_optimizer"})
"""Knobs a config sets outright, either way from the profile's value (DeepSpeed's stage3_max_reuse_distance,
reduce_bucket_size and use_multi_rank_bucket_allreduce; the BF16_Optimizer a data_types.grad_accum_dtype picks),
where the others only lower a share or a count the profile's flags would give."""


def _other_engine(view: ConfigView, framework) -> None:
    """Checked under another framework's profile than the reader's (a DeepSpeed JSON under --framework
    megatron-deepspeed), what the reader took from the engine of today (ConfigView.engine_knobs) gives way to that
    profile's own: the knobs are dropped, the layout fields restored, and a note says so."""
    for k in view.engine_knobs:
        view.knobs.pop(k, None)
    view.fields.update(view.engine_fields)
    view.remedy_names.clear()  # they name the remedies in terms of that engine's choice
    view.notes.append(f"checked as {framework.value}: the optimizer today's DeepSpeed engine would run for this config "
                      "(BF16_Optimizer) is not read; the profile's own optimizer stands")


def _config_knobs(view: ConfigView, problem):
    """The problem with what the config itself says that moves a knob below the profile's value: overlap it hides
    less of (its flags off), or the elementwise traffic of a compiled model (torchtitan's compile); or a model-code
    fact (a bool knob) or a setting (CONFIG_SETTING_KNOBS) it sets otherwise than the profile (torchtitan's eager
    RMSNorm, DeepSpeed's reuse distance and reduce bucket); a note names each."""
    from dataclasses import replace

    from planner.estimate import Problem

    def moves(k: str, v) -> bool:
        now = getattr(problem.knobs, k)
        return v != now if isinstance(now, bool) or k in CONFIG_SETTING_KNOBS else v < now

    # the Hugging Face Trainer's "auto" bucket takes the model's hidden size
    given = {k: float(problem.model.hidden_size) ** 2 if v == HIDDEN_SQUARED else v for k, (v, _) in view.knobs.items()}
    moved = {k: v for k, v in given.items() if moves(k, v)}
    if not moved:
        return problem
    whys = [why for k, (v, why) in view.knobs.items() if k in moved]
    view.notes.extend(f"{why} (predicted so)" for why in dict.fromkeys(whys))  # each reason once
    training = problem.training  # a compiled model is a training setting too (TrainingSpec.compile, as --compile)
    if "compiled_elementwise_share" in moved:
        training = training.model_copy(update={"compile": True})
    return Problem(problem.model, training, problem.cluster, replace(problem.knobs, **moved))


def _estimate(problem, layout: LayoutSpec, violations: list[dict]):
    """Predict for the batch the layout actually runs: with broken batch arithmetic the configured global batch
    would give a meaningless MFU (the violation already reports the arithmetic)."""
    runs = layout.micro_batch_size * layout.num_micro_batches * layout.dp
    if runs == problem.training.global_batch_size:
        return problem.estimate(layout), problem
    from planner.estimate import Problem

    training = problem.training.model_copy(update={"global_batch_size": runs})
    other = Problem(problem.model, training, problem.cluster, problem.knobs)
    return other.estimate(layout), other


def _memory(problem, layout: LayoutSpec, est, violations: list[dict], names: dict[str, str]) -> None:
    """A memory violation where the run cannot fit: the verdict estimate and plan show (planner.bands.verdict_for)
    is 'does not fit', the live tensors and the memory outside the allocator exceeding the GPU (or the host's
    memory exceeded). A 'tight' config passes with its memory line (render_report): published runs ran there, the
    allocator freeing its cache and retrying (validation's false-OOM count is of this verdict)."""
    from planner.bands import DOES_NOT_FIT, band_for, verdict_for

    if verdict_for(problem, est, band_for(problem, est)) != DOES_NOT_FIT:
        return
    stage = est.stages[est.peak_stage]
    live = est.peak_allocated_bytes + stage.overhead_bytes
    what = (f"{live / GIB:.1f} GiB live tensors + context/NCCL on stage {est.peak_stage} (of "
            f"{est.peak_memory_bytes / GIB:.1f} GiB with the allocator's cache) -> exceeds the GPU's "
            f"{est.gpu_memory_bytes / GIB:.1f} GiB" if est.host_memory_bytes_per_node <= est.host_memory_capacity_bytes
            else f"{est.host_memory_bytes_per_node / GIB:.1f} GiB of host memory per node -> exceeds the node's "
                 f"{est.host_memory_capacity_bytes / GIB:.1f} GiB")
    violations.append({"rule": "memory", "message": f"memory: {what}", "hint": _memory_hint(problem, layout, names)})


def _memory_hint(problem, layout: LayoutSpec, names: dict[str, str]) -> str:
    """Try the usual remedies and name the first ones that fit, with their predicted memory (each once), each as
    `names` says it where the config would say it otherwise (ConfigView.remedy_names)."""
    tries = []
    if layout.recompute != "full":
        if layout.recompute == "none":
            tries.append(with_fields(layout, {"recompute": "selective", "recompute_layers_per_stage": None}))
        tries.append(with_fields(layout, {"recompute": "full", "recompute_layers_per_stage": None}))
    if layout.zero_stage < (1 if layout.pp > 1 else 3) and layout.dp > 1:
        tries.append(with_fields(layout, {"zero_stage": layout.zero_stage + 1}))
    if layout.micro_batch_size > 1:
        f = layout.micro_batch_size // 2 if layout.micro_batch_size % 2 == 0 else 1
        tries.append(with_fields(layout, {"micro_batch_size": f,
                                               "num_micro_batches": layout.num_micro_batches * layout.micro_batch_size // f}))
    found: dict[str, str] = {}
    for t in tries:
        if layout_violations(t, problem.model, problem.training, problem.cluster):
            continue
        est = problem.estimate(t)
        diff = _diff(layout, t)
        diff = names.get(diff, diff)
        if diff not in found and est.fits and est.peak_memory_bytes + problem.knobs.memory_headroom_bytes <= \
                est.gpu_memory_bytes:
            found[diff] = f"{diff} fits at {est.peak_memory_bytes / GIB:.1f} GiB, {est.step_seconds:.3g} s/step"
    picks = list(found.values())[:2]
    return "; ".join(picks) if picks else "add pipeline stages, ZeRO, offload or GPUs (`planner plan` searches them)"


def _diff(a: LayoutSpec, b: LayoutSpec) -> str:
    da, db = a.model_dump(), b.model_dump()
    return ", ".join(f"{k}={db[k]}" for k in db if db[k] != da[k] and k not in ("num_micro_batches",
                                                                                  "recompute_layers_per_stage")) \
        or "as is"


def check_file(path: Path, args) -> dict:
    """One config -> its report (the CheckReport contract); SpecError propagates as could-not-check."""
    from cluster_specs import load_cluster
    from planner.contract import Predicted
    from planner.estimate import build_problem
    from planner.frameworks.restriction import parse_fix

    cl = load_cluster(args.cluster, nodes=args.nodes)
    overrides = parse_fix(args.fix)
    for key, value in (("tp", args.tp), ("pp", args.pp)):
        if value is not None:
            overrides[key] = value
    view = read_config(path, gpus=cl.num_gpus, overrides=dict(overrides), global_batch_size=args.global_batch_size,
                       config_function=getattr(args, "config_function", None))
    if "tp" in overrides or "pp" in overrides:  # the data-parallel size follows from the degrees given
        tp, pp = overrides.get("tp", view.fields.get("tp", 1)), overrides.get("pp", view.fields.get("pp", 1))
        cp = overrides.get("cp", view.fields.get("cp", 1))
        overrides.setdefault("dp", max(1, cl.num_gpus // (tp * pp * cp)))
    batch = view.global_batch_size or args.global_batch_size
    seq = view.seq_length or args.seq_len
    if not batch or not seq:
        missing = [n for n, v in (("--global-batch-size", batch), ("--seq-len", seq)) if not v]
        raise SpecError(f"{', '.join(missing)}: the config does not say; pass them", source=str(path))
    precision, source, precision_notes = _precision(view, args.precision)
    # the execution profile of the framework that runs the config (--framework, else the one the config is written
    # for), as plan and estimate use it: its memory recipe, overlap and allocator reserve
    fw = args.framework or view.framework.value
    problem = build_problem(args.cluster, args.nodes, args.model, batch, seq, precision, args.headroom_gib,
                            args.calibration, fw, *((view.fp8_recipe, view.fp8_param_gather) if precision == "fp8"
                                                    else (None, None)), optimizer_states=view.optimizer_states)
    out = check(view, problem, overrides=overrides, allow_tp_across_nodes=args.allow_tp_across_nodes,
                framework=args.framework)
    trained = problem.training
    return {"config": str(path), "format": view.format, "framework": fw,
            "layout": out.layout.model_dump(mode="json") if out.layout else None,
            "passed": not out.violations, "violations": out.violations,
            "predicted": Predicted.from_estimate(out.estimate, out.problem.knobs.memory_headroom_bytes, out.problem,
                                                 out.layout).model_dump() if out.estimate else None,
            "notes": out.notes + precision_notes, "error": None,
            "precision": trained.precision.value, "precision_source": source,
            "fp8_recipe": trained.fp8_recipe if trained.precision == "fp8" else None}


PRECISIONS = tuple(p.value for p in Precision)  # the training precisions (cost_models.inputs.Precision)


def _precision(view: ConfigView, given: str | None) -> tuple[str | None, str, list[str]]:
    """(the precision to check, where it comes from, notes): the config's; --precision where the config does not
    say, where it says only its framework's default (ConfigView.precision_default), or where it says the 16-bit base
    of an FP8 run whose FP8 switch the planner cannot read (a torchtitan Python recipe's float8 converter is model
    code); the GPU's default (build_problem) where neither says."""
    said = view.precision if view.precision in PRECISIONS else None
    if given == "fp8" and said in ("bf16", "fp16"):
        return "fp8", "--precision", []
    if said is None:
        return given, "--precision" if given else "GPU default", []
    if view.precision_default:
        if given and given != said:
            return given, "--precision", [f"--precision {given} over the config's {said} ({view.precision_default})"]
        return said, "framework default", [f"precision {said}: {view.precision_default}"]
    notes = [f"precision {said} from the config (not --precision {given})"] if given and given != said else []
    return said, "config", notes


def render_report(out, r: dict, *, several: bool) -> None:
    """The terminal form of one report: FAIL lines with their fix, notes, the prediction, the verdict."""
    if several:
        out.print(f"[bold]{r['config']}[/bold] ({r['format'] or '?'}, {r['framework'] or '?'})", highlight=False)
    if r["error"]:
        out.print(f"[yellow]COULD NOT CHECK[/yellow] {r['error']}", highlight=False)
        return
    for v in r["violations"]:
        out.print(f"[red]FAIL[/red] {v['message']}\n     fix: {v['hint']}", highlight=False)
    for n in r["notes"]:
        out.print(f"[dim]note: {n}[/dim]", highlight=False)
    if r.get("precision"):  # what was read, as the JSON says it (CheckReport.precision, fp8_recipe, precision_source)
        recipe = f", FP8 recipe {r['fp8_recipe']}" if r.get("fp8_recipe") else ""
        out.print(f"precision: {r['precision']}{recipe} ({r['precision_source']})", highlight=False)
    p = r["predicted"]
    if p is not None:
        mfu = f"MFU {p['mfu']:.1%}, " if 0 < p["mfu"] <= 1 else ""
        out.print(f"predicted: {p['step_time_seconds']:.3g} s/step, {p['tokens_per_second']:,.0f} tokens/s, {mfu}"
                  f"peak {p['peak_memory_bytes_per_gpu'] / GIB:.1f} of {p['gpu_memory_bytes'] / GIB:.1f} GiB per GPU "
                  f"(stage {p['peak_memory_stage']})", highlight=False)
        if p.get("fit") == "tight":  # passed or not, what the band says, as plan and estimate show it
            from planner.explain.report import fit_text

            out.print(f"memory: {fit_text('tight', p['fits'])}", highlight=False)
    out.print("[green]PASS[/green]" if r["passed"] else f"[red]{len(r['violations'])} violation(s)[/red]")


def check_files(configs: list, args, *, as_json: bool) -> tuple[object, list[dict], int]:
    """Check each config in turn: (the JSON document, the reports, the exit code). A config that cannot be checked
    is exit 3 (it wins over 1, a violation), or 8 where the operating system would not read it (it wins over 3, as
    README's exit-code table orders them); with one config and no --json its error is raised as is."""
    from cluster_specs import SpecError
    from planner import SCHEMA_VERSION, __version__
    from planner.contract import CheckBatch, CheckReport
    from planner.frameworks.capabilities import parse_framework

    if args.framework is not None:
        args.framework = parse_framework(args.framework).value
    from planner.errors import ExitCode, exit_code_for

    reports = []
    unread = False
    for path in configs:
        head = {"schema_version": SCHEMA_VERSION, "tool_version": __version__, "kind": "check"}
        try:
            reports.append({**head, **check_file(path, args)})
        except SpecError as exc:
            if len(configs) == 1 and not as_json:
                raise
            unread = unread or exit_code_for(exc) == ExitCode.IO
            reports.append({**head, "config": str(path), "format": None, "framework": args.framework, "layout": None,
                            "passed": False, "violations": [], "predicted": None, "notes": [],
                            "error": str(exc).splitlines()[0] if str(exc) else "could not check"})
    code = (int(ExitCode.IO) if unread else 3 if any(r["error"] for r in reports)
            else 1 if any(not r["passed"] for r in reports) else 0)
    typed = [CheckReport.model_validate(r) for r in reports]
    doc = typed[0] if len(typed) == 1 else CheckBatch(schema_version=SCHEMA_VERSION, tool_version=__version__,
                                                      passed=code == 0, exit_code=code, reports=typed)
    return doc, reports, code
