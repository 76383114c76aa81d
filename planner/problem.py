"""`Problem`: the three inputs of a planning question (model, training setup, cluster) and the modelling knobs,
with their cost-model views derived once."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from cluster_specs import ClusterSpec
from cost_models.compute import parameter_counts
from cost_models.inputs import Hardware, Knobs, Training, Transformer
from cost_models.step import StepEstimate, estimate_step
from planner.defaults import DEFAULT_HEADROOM_GIB
from planner.inputs.specs import LayoutSpec, ModelSpec, TrainingSpec

GIB = 2**30
DEFAULT_HEADROOM_BYTES = DEFAULT_HEADROOM_GIB * GIB


def default_knobs() -> Knobs:
    """The knobs every entry point plans with unless told otherwise: `Knobs()` plus the default headroom."""
    return Knobs(memory_headroom_bytes=DEFAULT_HEADROOM_BYTES)


@dataclass(frozen=True)
class Problem:
    """The inputs; `hardware`, `cm_model` and `cm_training` are their cost-model views, computed on first use."""

    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    knobs: Knobs = field(default_factory=Knobs)

    @cached_property
    def hardware(self) -> Hardware:
        return self.cluster.to_cost_model(self.training.compute_dtype)

    @cached_property
    def cm_model(self) -> Transformer:
        return self.model.to_cost_model(seq_length=self.training.seq_length)

    @cached_property
    def cm_training(self) -> Training:
        """The training's cost-model view with the framework profile's memory recipe (16-bit training whose
        gradient dtype the user did not set; fp32 training keeps no master copy) and its gradient-reduce dtype (where
        the user set none), less what lower-precision optimizer
        states save (TrainingSpec.optimizer_state_saved_bytes, with the profile's cost of an fp32 master copy
        under its precision-aware optimizer)."""
        tr = self.training
        cm = tr.to_cost_model()
        if self.knobs.grad_reduce_16bit and tr.precision == "bf16" and tr.grad_reduce_dtype is None:
            cm = replace(cm, grad_reduce_bytes=2)  # bf16, as the framework reduces (Profile.grad_reduce_16bit)
        remainders = tr.low_precision_states and tr.precision in ("bf16", "fp8")
        saved = tr.optimizer_state_saved_bytes(self.knobs.precision_aware_master_bytes if remainders else 4)
        recipe = self.knobs.state_bytes_per_param
        if recipe is None or tr.precision == "fp32" or tr.grad_dtype is not None:
            return replace(cm, optimizer_bytes=cm.optimizer_bytes + cm.optimizer_state_saved_bytes - saved,
                           optimizer_state_saved_bytes=saved)
        zero0, piped = self.knobs.zero0_optimizer, self.knobs.zero0_pipeline_optimizer
        return replace(cm, param_bytes=recipe[0], grad_bytes=recipe[1], optimizer_bytes=recipe[2] - saved,
                       optimizer_state_saved_bytes=saved,
                       zero0_optimizer=None if zero0 is None else zero0.less_optimizer_bytes(saved),
                       zero0_pipeline_optimizer=None if piped is None else piped.less_optimizer_bytes(saved))

    @cached_property
    def parameter_counts(self) -> dict[str, int]:
        """The model's parameters per part (ModelSpec.parameter_counts), computed once per problem."""
        return self.model.parameter_counts()

    @cached_property
    def total_params(self) -> int:
        return parameter_counts(self.cm_model).total

    def estimate(self, layout: LayoutSpec) -> StepEstimate:
        return estimate_step(self.cm_model, self.cm_training, self.hardware, layout.to_cost_model(), self.knobs)
