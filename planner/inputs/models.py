"""Model presets, model spec files, and local Hugging Face config.json files -> ModelSpec."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from cluster_specs import SpecError, read_structured_file
from cluster_specs.errors import from_pydantic, unknown_name
from cluster_specs.limits import is_int_at_least
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
    hf = isinstance(data, dict) and ("model_type" in data or "architectures" in data)
    if hf:
        data = hf_config_to_spec(data, source=str(path))
    data = dict(data) if isinstance(data, dict) else data
    if isinstance(data, dict):
        data.setdefault("name", path.stem)
    try:
        return _validate(data, str(path))
    except SpecError as exc:
        if not hf:
            raise
        raise SpecError([_hf_named(line) for line in exc.problems], source=str(path)) from None


# the planner's fields -> the config.json keys the readers take them from (a problem a check across fields finds
# names both, so the user knows which line of their file to look at)
HF_KEYS = {"num_layers": "num_hidden_layers", "num_kv_heads": "num_key_value_heads", "ffn_hidden_size": "intermediate_size",
           "moe.num_experts": "num_experts / num_local_experts / n_routed_experts", "moe.top_k": "num_experts_per_tok",
           "moe.expert_ffn_hidden_size": "moe_intermediate_size",
           "moe.num_dense_layers": "first_k_dense_replace / moe_layer_freq / decoder_sparse_step / mlp_only_layers",
           "moe.expert_groups": "n_group", "moe.groups_per_token": "topk_group",
           "sliding_window_layers": "layer_types / max_window_layers / sliding_window_pattern"}


def _hf_named(line: str) -> str:
    key = line.split(":", 1)[0]
    hf = HF_KEYS.get(key)
    return f"{key} (config.json {hf}){line[len(key):]}" if hf else line


HF_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
               "gemma3_text", "phi3", "olmo", "falcon", "deepseek_v2", "deepseek_v3", "gpt2", "gpt_neox", "nemotron")

# model_type -> what the cost model lacks for it (the rejection names it and points to a hand-written spec)
HF_UNSUPPORTED = {
    **dict.fromkeys(("t5", "mt5", "umt5", "bart", "mbart", "pegasus", "marian", "whisper", "led", "longt5",
                     "switch_transformers", "encoder-decoder"), "encoder-decoder models (only decoder-only is modelled)"),
    **dict.fromkeys(("mamba", "mamba2", "falcon_mamba", "rwkv", "recurrent_gemma"),
                    "state-space/recurrent layers (no attention layers to model)"),
    **dict.fromkeys(("jamba", "zamba", "zamba2", "bamba", "nemotron_h", "granitemoehybrid"),
                    "hybrid attention/state-space layer stacks"),
    **dict.fromkeys(("bert", "roberta", "deberta", "deberta-v2", "electra", "modernbert"),
                    "encoder-only models (no causal LM training step)"),
    "olmo2": "OLMo-2's q/k norms over the whole projection (a·d and g·d wide; Qwen3-style per-head qk_norm is modelled)",
}
_HAND_SPEC = ("describe the decoder by hand in a model YAML (num_layers, hidden_size, num_attention_heads, "
              "num_kv_heads, head_dim, ffn_hidden_size, vocab_size, mlp, norm, moe:, mla:, sliding_window; the README "
              "shows one)")


def hf_config_to_spec(cfg: dict, *, source: str = "config.json") -> dict:
    """Map a Hugging Face config.json to ModelSpec fields (families: HF_FAMILIES; field meanings:
    ../shared/reference/modern-training.md §6.1). Unknown or unsupported families are refused with what is missing."""
    kind = cfg.get("model_type")
    reader = _HF_READERS.get(kind) if isinstance(kind, str) else None
    if reader is None:
        text = cfg.get("text_config")
        if isinstance(text, dict):
            inner = text.get("model_type")
            if inner in _HF_READERS:
                raise SpecError(f"model_type: {kind!r} -> a multimodal wrapper: the planner models the text decoder "
                                f"only; save its text_config (model_type {inner!r}) as a config.json and pass that",
                                source=source)
            raise SpecError(f"model_type: {kind!r} -> a multimodal wrapper whose text decoder (model_type {inner!r}) "
                            f"is not a supported family ({', '.join(HF_FAMILIES)}); {_HAND_SPEC}", source=source)
        why = HF_UNSUPPORTED.get(kind) if isinstance(kind, str) else None
        lead = f"not modelled: {why}" if why else f"not a supported family ({', '.join(HF_FAMILIES)})"
        raise SpecError(f"model_type: {kind!r} -> {lead}; {_HAND_SPEC}", source=source)
    typed = _Cfg(cfg, str(kind), source)
    return {"name": _hf_model_name(cfg, source, str(kind)), "source": f"Hugging Face config ({source}, model_type {kind})",
            **reader(typed)}


def _hf_model_name(cfg: dict, source: str, kind: str) -> str:
    """The config's own `_name_or_path`; else a snapshot's folder for a file named config.json (e.g.
    Llama-2-7b-hf/config.json), else the file's stem (llama65b.json: llama65b, not the folder it was saved in)."""
    named = cfg.get("_name_or_path")
    if isinstance(named, str) and named.strip():
        return named
    path = Path(source)
    return (path.parent.name if path.name.lower() == "config.json" else path.stem) or kind


class _Cfg:
    """Typed access to config.json fields with one-line errors naming the HF key."""

    def __init__(self, raw: dict, kind: str, source: str):
        self.raw, self.kind, self.source = raw, kind, source

    def _bad(self, key, value, allowed):
        raise SpecError(f"{key}: {value!r} -> {allowed} (model_type {self.kind})", source=self.source)

    def int(self, *keys, default=None, minimum=1):
        for key in keys:
            value = self.raw.get(key)
            if value is None:
                continue
            if not is_int_at_least(value, minimum):
                self._bad(key, value, f"must be an integer >= {minimum}")
            return value
        if default is None:
            raise SpecError(f"{keys[0]}: missing -> required for model_type {self.kind}", source=self.source)
        return default

    def opt_int(self, key, minimum=1):
        return self.int(key, default=0, minimum=minimum) if self.raw.get(key) is not None else None

    def flag(self, key, default=False):
        value = self.raw.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            self._bad(key, value, "must be true or false")
        return value


def _decoder(c: _Cfg, *, mlp="swiglu", norm="rmsnorm", tied=False) -> dict:
    """Fields shared by the Llama-like families: GQA heads, explicit head_dim, RoPE, no biases."""
    heads = c.int("num_attention_heads")
    spec = {
        "num_layers": c.int("num_hidden_layers"), "hidden_size": c.int("hidden_size"),
        "num_attention_heads": heads, "num_kv_heads": c.int("num_key_value_heads", default=heads),
        "ffn_hidden_size": c.int("intermediate_size"), "vocab_size": c.int("vocab_size"),
        "position_embedding": "rope", "mlp": mlp, "norm": norm, "bias": False,
        "tied_embeddings": c.flag("tie_word_embeddings", tied),
        "attention_bias": c.flag("attention_bias"),
    }
    head_dim = c.opt_int("head_dim")
    if head_dim is not None:
        spec["head_dim"] = head_dim
    if c.flag("mlp_bias"):
        c._bad("mlp_bias", True, "not modelled (MLP biases without attention biases); " + _HAND_SPEC)
    return spec


def _window(c: _Cfg, spec: dict, layers: int | None = None) -> dict:
    window = c.opt_int("sliding_window")
    if window is not None:
        spec["sliding_window"] = window
        spec["sliding_window_layers"] = spec["num_layers"] if layers is None else layers
    return spec


LAYER_TYPES = ("sliding_attention", "full_attention")


def _layer_types(c: _Cfg, default_sliding: int) -> int:
    """Sliding layers from HF's `layer_types` list when present, else the family's pattern. The list has one entry
    per layer, each one of LAYER_TYPES (transformers' layer_type_validation raises otherwise)."""
    types = c.raw.get("layer_types")
    if types is None:
        return default_sliding
    layers = c.int("num_hidden_layers")
    if not isinstance(types, list) or len(types) != layers or any(t not in LAYER_TYPES for t in types):
        shown = f"a list of {len(types)}" if isinstance(types, list) else repr(types)[:40]
        c._bad("layer_types", shown, f"a list of {layers} entries (num_hidden_layers), each "
                                      f"{' or '.join(LAYER_TYPES)}")
    return sum(1 for t in types if t == "sliding_attention")


def _llama(c):
    return _decoder(c)


def _mistral(c):
    return _window(c, _decoder(c))


def _qwen_window(c, spec):
    if c.flag("use_sliding_window"):
        full = c.int("max_window_layers", default=spec["num_layers"], minimum=0)
        _window(c, spec, _layer_types(c, max(spec["num_layers"] - full, 0)))
    return spec


def _qwen2(c):
    spec = _decoder(c)
    spec["qkv_bias"], spec["attention_bias"] = True, False  # Qwen2Attention: bias on q, k, v; none on o
    return _qwen_window(c, spec)


def _qwen3(c):
    return _qwen_window(c, {**_decoder(c), "qk_norm": True})


def _leading_dense(c, dense: list[int], key: str, value) -> int:
    """The count of dense layers where they lead the stack (DeepSeek's first_k_dense_replace), which is what the
    planner can say (MoESpec.num_dense_layers, exported as Megatron's --moe-layer-freq and torchtitan's
    n_dense_layers); dense layers between MoE ones are refused, not counted as leading."""
    if dense != list(range(len(dense))):
        c._bad(key, value, f"dense layers {dense[:6]}{'...' if len(dense) > 6 else ''} between MoE layers: the planner "
                           "models MoE stacks whose dense layers lead (first_k_dense_replace); " + _HAND_SPEC)
    return len(dense)


def _qwen_moe_dense_layers(c, layers):
    step = c.int("decoder_sparse_step", default=1)
    only = c.raw.get("mlp_only_layers") or []
    if not isinstance(only, list):
        c._bad("mlp_only_layers", only, "must be a list of layer indices")
    dense = [i for i in range(layers) if i in only or (i + 1) % step != 0]
    return _leading_dense(c, dense, "decoder_sparse_step" if step > 1 else "mlp_only_layers",
                          step if step > 1 else only)


def _qwen2_moe(c):
    spec = _qwen2(c)
    shared = c.int("shared_expert_intermediate_size", default=0, minimum=0)
    spec["moe"] = {
        "num_experts": c.int("num_experts"), "top_k": c.int("num_experts_per_tok"),
        "expert_ffn_hidden_size": c.int("moe_intermediate_size"),
        "shared_expert_ffn_hidden_size": shared, "shared_expert_gate": shared > 0,
        "num_dense_layers": _qwen_moe_dense_layers(c, spec["num_layers"]),
    }
    return spec


def _qwen3_moe(c):
    spec = _qwen3(c)
    spec["moe"] = {
        "num_experts": c.int("num_experts"), "top_k": c.int("num_experts_per_tok"),
        "expert_ffn_hidden_size": c.int("moe_intermediate_size"),
        "num_dense_layers": _qwen_moe_dense_layers(c, spec["num_layers"]),
    }
    return spec


def _mixtral(c):
    spec = _window(c, _decoder(c))
    spec["moe"] = {"num_experts": c.int("num_local_experts", "num_experts"), "top_k": c.int("num_experts_per_tok"),
                   "expert_ffn_hidden_size": spec["ffn_hidden_size"]}
    return spec


def _gemma(c):
    return _decoder(c, mlp="geglu", tied=True)


def _gemma2(c):
    spec = {**_decoder(c, mlp="geglu", tied=True), "norms_per_layer": 4}
    # HF Gemma-2: layer i is local when i % 2 == 0 (layer 0 local); `layer_types` when given
    return _window(c, spec, _layer_types(c, (spec["num_layers"] + 1) // 2))


# transformers' Gemma3TextConfig defaults for the fields Google's released text_configs leave out (the 4B's has no
# num_attention_heads, the 27B's no vocab_size): configuration_gemma3.py Gemma3TextConfig.__init__
GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262208, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256}


def _gemma3_text(c):
    missing = {k: v for k, v in GEMMA3_TEXT_DEFAULTS.items() if c.raw.get(k) is None}
    c = _Cfg({**c.raw, **missing}, c.kind, c.source)
    spec = {**_decoder(c, mlp="geglu", tied=True), "norms_per_layer": 4, "qk_norm": True}
    pattern = c.int("sliding_window_pattern", default=6)
    local = sum(1 for i in range(spec["num_layers"]) if (i + 1) % pattern)
    return _window(c, spec, _layer_types(c, local))


def _phi3(c):
    # fused qkv_proj and gate_up_proj have the unfused counts; HF passes config.sliding_window to attention
    return _window(c, _decoder(c))


def _olmo(c):
    # OLMo v1: "LayerNorm but with no learnable weight or bias"; clip_qkv has no parameters
    return _decoder(c, norm="nonparametric")


def _falcon(c):
    heads = c.int("num_attention_heads", "n_head")
    h = c.int("hidden_size")
    if c.flag("new_decoder_architecture"):
        kv = c.int("num_kv_heads", "n_head_kv", default=heads)
        norms = 1 if c.int("num_ln_in_parallel_attn", default=2) == 1 else 2
    else:
        kv = 1 if c.flag("multi_query", True) else heads
        norms = 1 if c.flag("parallel_attn", True) else 2
    return {
        "num_layers": c.int("num_hidden_layers", "n_layer"), "hidden_size": h, "num_attention_heads": heads,
        "num_kv_heads": kv, "ffn_hidden_size": c.int("ffn_hidden_size", default=4 * h), "vocab_size": c.int("vocab_size"),
        "mlp": "gelu", "norm": "layernorm", "norms_per_layer": norms, "bias": c.flag("bias"),
        "tied_embeddings": c.flag("tie_word_embeddings", True),
        "position_embedding": "alibi" if c.flag("alibi") else "rope",
    }


def _deepseek(c):
    heads = c.int("num_attention_heads")
    layers = c.int("num_hidden_layers")
    first_dense = c.int("first_k_dense_replace", default=0, minimum=0)
    freq = c.int("moe_layer_freq", default=1)
    dense = [i for i in range(layers) if not (i >= first_dense and i % freq == 0)]
    moe_layers = layers - _leading_dense(c, dense, "moe_layer_freq", freq)
    fe = c.int("moe_intermediate_size")
    spec = {
        "num_layers": layers, "hidden_size": c.int("hidden_size"), "num_attention_heads": heads,
        "ffn_hidden_size": c.int("intermediate_size"), "vocab_size": c.int("vocab_size"), "mlp": "swiglu",
        "norm": "rmsnorm", "bias": False, "attention_bias": c.flag("attention_bias"), "position_embedding": "rope",
        "tied_embeddings": c.flag("tie_word_embeddings"),
        "mla": {"q_lora_rank": c.opt_int("q_lora_rank"), "kv_lora_rank": c.int("kv_lora_rank"),
                "qk_nope_head_dim": c.int("qk_nope_head_dim"), "qk_rope_head_dim": c.int("qk_rope_head_dim", minimum=0),
                "v_head_dim": c.int("v_head_dim")},
        "moe": {"num_experts": c.int("n_routed_experts", "num_local_experts"), "top_k": c.int("num_experts_per_tok"),
                "expert_ffn_hidden_size": fe,
                "shared_expert_ffn_hidden_size": c.int("n_shared_experts", default=0, minimum=0) * fe,
                # V3's noaux_tc router keeps an E-sized e_score_correction_bias per layer (counted in 671B)
                "router_bias": c.raw.get("topk_method") == "noaux_tc" or c.kind == "deepseek_v3",
                "num_dense_layers": layers - moe_layers, **_expert_groups(c)},
    }
    return spec


def _expert_groups(c) -> dict:
    """Group-limited routing from `n_group`/`topk_group` (V2 group_limited_greedy, V3 noaux_tc: top-k groups, then
    top-k experts in them; HF modular_deepseek_v3.py); V2-Lite's greedy router (n_group 1) has none."""
    groups = c.int("n_group", default=1, minimum=1)
    chosen = c.int("topk_group", default=groups, minimum=1)
    if groups <= 1 or chosen >= groups or c.raw.get("topk_method") == "greedy":
        return {}
    return {"expert_groups": groups, "groups_per_token": chosen}


def _gpt2(c):
    h = c.int("n_embd")
    return {
        "num_layers": c.int("n_layer"), "hidden_size": h, "num_attention_heads": c.int("n_head"),
        "ffn_hidden_size": c.int("n_inner", default=4 * h), "vocab_size": c.int("vocab_size"),
        "max_position_embeddings": c.int("n_positions", default=1024), "position_embedding": "learned",
        "tied_embeddings": c.flag("tie_word_embeddings", True), "mlp": "gelu", "norm": "layernorm", "bias": True,
        "dropout": bool(c.raw.get("resid_pdrop", 0.1)),
    }


def _gpt_neox(c):
    return {**_decoder(c, mlp="gelu", norm="layernorm"), "bias": True, "attention_bias": False}


def _nemotron(c):
    """Nemotron-4 / Minitron (transformers NemotronForCausalLM): GQA, a non-gated squared-ReLU MLP, LayerNorm1P
    (LayerNorm's parameters, 1 + gamma), partial RoPE, no biases, untied embeddings."""
    act = c.raw.get("hidden_act", "relu2")
    if act != "relu2":
        c._bad("hidden_act", act, "relu2 (Nemotron's squared ReLU; another activation: " + _HAND_SPEC + ")")
    return _decoder(c, mlp="relu2", norm="layernorm")


_HF_READERS = {
    "llama": _llama, "mistral": _mistral, "mixtral": _mixtral, "qwen2": _qwen2, "qwen2_moe": _qwen2_moe,
    "qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "gemma": _gemma, "gemma2": _gemma2, "gemma3_text": _gemma3_text,
    "phi3": _phi3, "olmo": _olmo, "falcon": _falcon, "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
    "gpt2": _gpt2, "gpt_neox": _gpt_neox, "nemotron": _nemotron,
}
