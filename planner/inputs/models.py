"""Model presets, model spec files, and local Hugging Face config.json files -> ModelSpec."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from cluster_specs import SpecError, read_structured_file
from cluster_specs.errors import from_pydantic, unknown_name
from planner.inputs.specs import ModelSpec


@functools.cache
def _presets() -> dict:
    import yaml

    return yaml.safe_load(resources.files("planner.data").joinpath("models.yaml").read_text("utf-8"))


def model_names() -> list[str]:
    return sorted(_presets())


def _validate(data, source: str) -> ModelSpec:
    from pydantic import ValidationError

    if not isinstance(data, dict):
        raise SpecError(f"expected a mapping of model fields, got {type(data).__name__}", source=source)
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise from_pydantic(exc, source=source) from None


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name, a model spec file (YAML/JSON), or a Hugging Face config.json (detected by model_type)."""
    presets = _presets()
    if name_or_path in presets:
        return _validate({"name": name_or_path, **presets[name_or_path]}, f"model preset {name_or_path}")
    path = Path(name_or_path)
    if not (path.suffix.lower() in (".yaml", ".yml", ".json") or path.exists()):
        raise unknown_name("model", name_or_path, list(presets))
    if path.is_dir():  # a Hugging Face snapshot directory: its config.json describes the model
        if not (path / "config.json").is_file():
            raise SpecError("a directory without config.json -> give a model file, a Hugging Face config.json, or "
                            "a snapshot directory holding one", source=str(path))
        path = path / "config.json"
    data = read_structured_file(path)
    if isinstance(data, dict) and ("model_type" in data or "architectures" in data):
        data = hf_config_to_spec(data, source=str(path))
    data = dict(data) if isinstance(data, dict) else data
    if isinstance(data, dict):
        data.setdefault("name", path.stem)
    return _validate(data, str(path))


HF_FAMILIES = ("llama", "mistral", "qwen2", "gpt2", "gpt_neox")


def hf_config_to_spec(cfg: dict, *, source: str = "config.json") -> dict:
    """Map a Hugging Face config.json (Llama, Mistral, Qwen2, GPT-2, GPT-NeoX) to ModelSpec fields."""
    kind = cfg.get("model_type")
    if kind not in HF_FAMILIES:
        raise SpecError(f"model_type: {kind!r} -> supported: {', '.join(HF_FAMILIES)}", source=source)

    def need(key):
        if key not in cfg or cfg[key] is None:
            raise SpecError(f"{key}: missing (required for model_type {kind})", source=source)
        return cfg[key]

    name = cfg.get("_name_or_path") or Path(source).parent.name or kind
    if kind == "gpt2":
        h = need("n_embd")
        return {
            "name": name, "source": f"Hugging Face config ({source})",
            "num_layers": need("n_layer"), "hidden_size": h, "num_attention_heads": need("n_head"),
            "ffn_hidden_size": cfg.get("n_inner") or 4 * h, "vocab_size": need("vocab_size"),
            "max_position_embeddings": cfg.get("n_positions", 1024), "position_embedding": "learned",
            "tied_embeddings": cfg.get("tie_word_embeddings", True), "mlp": "gelu", "norm": "layernorm", "bias": True,
            "dropout": bool(cfg.get("resid_pdrop", 0.1)),
        }
    common = {
        "name": name, "source": f"Hugging Face config ({source})",
        "num_layers": need("num_hidden_layers"), "hidden_size": need("hidden_size"),
        "num_attention_heads": need("num_attention_heads"), "ffn_hidden_size": need("intermediate_size"),
        "vocab_size": need("vocab_size"), "position_embedding": "rope",
    }
    if kind == "gpt_neox":
        return {**common, "tied_embeddings": cfg.get("tie_word_embeddings", False), "mlp": "gelu",
                "norm": "layernorm", "bias": True}
    return {**common, "num_kv_heads": cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
            "tied_embeddings": cfg.get("tie_word_embeddings", False), "mlp": "swiglu", "norm": "rmsnorm",
            "bias": False}
