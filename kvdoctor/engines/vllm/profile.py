"""`vllm` for `check`: what vLLM 0.33.0 (v1 engine, CUDA) does with this model at start-up, predicted statically.

The order is vLLM's: the config stage (transformers' layer_types check, max_model_len against the derived
limit, TP against the heads, the HMA decision), the model class's per-layer specs (specs.py), then KV
planning (HMA-off promotion, hybrid block alignment, page unification, grouping, the admission check
against `kv_budget`), the latter through kvdoctor.engines.vllm.budget, which goldens/vllm.json checks.
Page sizes are the CUDA ones (FlashAttention / FlashAttention-MLA on an H200: block 16 unless set);
a CPU start-up picks other blocks. Imports no torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence, TypeGuard

import msgspec
from pydantic import BaseModel

from kvdoctor.engines.budget.common import EngineRefusal
from kvdoctor.engines.budget.facts import (POSITION_KEYS, Layer, Mamba1Dims, Mamba2Dims, ShortConvDims,
                                           facts_from_spec)
from kvdoctor.engines.base import DryRunner, EngineProfile, LayerPlan, Plan, Probe, Refusal
from kvdoctor.engines.pins import PINS
from kvdoctor.engines.releases import at
from kvdoctor.engines.vllm import dsv4, registry, releases
from kvdoctor.engines.vllm import specs as S
from kvdoctor.engines.vllm.refusals import (CODES, VERSION, Startup, afmoe_layer_types_unset, dsv4_compressor_head,
                                            chunked_prefill_for_mamba_caching, vision_config_missing,
                                            config_class_rejects, from_budget, gemma4_global_head_dim, hma_forced_on,
                                            kv_heads_split, layer_types_length_own_class, mamba2_groups_split,
                                            mamba_block_without_prefix_caching,
                                            max_model_len_over, nvfp4_with_mla, remote_code_not_trusted,
                                            rope_type_unknown, sliding_mla_promotion, strict_null_window,
                                            text_config_not_a_config, tp_heads, unrecognized_model_type,
                                            vision_heads_split)
from kvdoctor.engines.vllm.settings import VllmSettings
from kvdoctor.errors import InputError
from kvdoctor.load import hf_config
from kvdoctor.load.families import family_for
from kvdoctor.model import (CHUNKED, COMPRESSED, FULL, GDN, KDA, LINEAR, MLA, NO_ATTENTION, SLIDING, SPARSE_MLA,
                            ModelSpec)

if TYPE_CHECKING:
    from kvdoctor.engines.budget.common import Budget, BudgetView
    from kvdoctor.engines.vllm import budget as budget_vllm
    from kvdoctor.engines.budget.facts import ModelFacts
    from kvdoctor.engines.budget.settings import BudgetSettings

PLATFORM = "cuda (H200, FlashAttention / FlashAttention-MLA backends, block 16 unless block_size is set)"
UNBOUNDED = 1 << 60  # no kv_budget: vLLM's admission check runs against memory it profiles on the GPU
CACHE_LABELS = {S.FULL: "full", S.SLIDING: "windowed", S.CHUNKED: "chunked", S.MLA: "mla", S.MAMBA: "state"}
BUDGET_KINDS = {S.FULL: "full", S.SLIDING: "sliding", S.CHUNKED: "chunked", S.MLA: "mla"}
KV_HEAD_KINDS = {BUDGET_KINDS[spec] for spec in (S.FULL, S.SLIDING, S.CHUNKED)}  # split by TP (not MLA's latent)
ATTENTION_KINDS = (FULL, SLIDING, CHUNKED, MLA, SPARSE_MLA, LINEAR, GDN, KDA)  # layers the table's rules cover
GEMMA4_TYPES = ("gemma4", "gemma4_text")  # Gemma4ModelArchConfigConvertor's heterogeneous configs seen refused
ROPE_FACTOR_FREE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling", "default")


class Group(msgspec.Struct, frozen=True):
    spec: str  # the spec class the group's layers share after HMA-off promotion
    layer_ids: tuple[int, ...]
    block_size: int
    page_bytes: int
    window: int | None = None


class VllmFacts(msgspec.Struct, frozen=True):
    architecture: str
    is_hybrid: bool  # vLLM's sense: the model class has a Mamba-style state (IsHybrid)
    hma: bool
    hma_why: str
    max_model_len: int | None
    derived_max_model_len: float | None
    derived_from: str | None
    block_size: int | None
    groups: tuple[Group, ...]
    model_window: int | None  # CacheConfig.sliding_window: the window a layer without its own gets
    layer_types: tuple[str, ...] | None  # what transformers holds, as vLLM's model class reads it
    platform: str = PLATFORM
    unmodeled: str | None = None  # why the static profile gives no per-layer specs for this model (VLM024)


class VllmProfile(EngineProfile):
    """vLLM for `check` (plan, the paged-cache probe, the dry run, `info.vllm`) and `budget`, both
    reading the one `vllm:` section (VllmSettings, vLLM's own argument names)."""

    name = "vllm"
    probe_extra = ("torch", "its probe builds torch paged KV caches")
    pins = {"vllm": PINS["vllm"]}
    release_dist = "vllm"
    Settings = VllmSettings
    # the codes plan() can put in Plan.refusals whose entries the refusal rule owns; MEM002/MEM004/MEM014
    # are checks.budget's, which leaves them to this plan under `check --engine vllm`, and CFG023
    # checks.cfg_geometry's (an unknown RoPE type, which vLLM refuses while it builds the model)
    refusal_codes = tuple(code for code in CODES if not code.startswith(("MEM", "CFG")))
    shared_refusal_codes = tuple(code for code in CODES if code.startswith(("MEM", "CFG")))
    answers_unread = True  # its config stage (unknown model_type, remote code) comes before any layer

    def plan(self, spec: ModelSpec, settings: BaseModel) -> Plan[VllmFacts]:
        return plan(spec, settings if isinstance(settings, VllmSettings) else VllmSettings())

    budget_setting_keys = {"hma": "disable_hybrid_kv_cache_manager", "tp": "tensor_parallel_size",
                           "block_size": "block_size", "max_num_seqs": "max_num_seqs",
                           "kv_cache_dtype": "kv_cache_dtype"}

    def budget_view(self, row: Mapping[str, Any]) -> BudgetView:
        from kvdoctor.engines.vllm.budget import view

        return view(dict(row))

    def budget(self, facts: ModelFacts, config: Mapping[str, Any], settings: BaseModel, inputs: BudgetSettings,
               all_modes: bool) -> tuple[Sequence[Budget], dict[str, Any]]:
        settings = settings if isinstance(settings, VllmSettings) else VllmSettings()
        try:
            hma = hma_decision(config, settings)[0]
        except Startup:
            hma = True  # forced on where vLLM refuses it (VLM008, reported by check): size it as asked
        # the sizing model loads where it is used: a deploy file loads every profile class (for its Settings),
        # and `check --static` must not load it
        from kvdoctor.engines.vllm import budget as budget_vllm

        return budget_vllm.budgets(facts, settings, inputs, all_modes, hma)

    def fit(self, spec: ModelSpec, facts: ModelFacts, gpu: Any, layout: Mapping[str, Any], request: Any,
            settings: Mapping[str, Any]) -> Any:
        from kvdoctor.engines.vllm import fit as fit_vllm

        return fit_vllm.fit(spec, facts, gpu, dict(layout), request, dict(settings))

    def fit_layouts(self, facts: ModelFacts, config: Mapping[str, Any], gpus: int) -> list[dict[str, Any]]:
        from kvdoctor.engines.vllm import fit as fit_vllm

        return fit_vllm.layouts(facts, dict(config), gpus)

    def budget_facts(self, spec: ModelSpec) -> ModelFacts:
        """For a model class in kvdoctor's vLLM table, the layers as vLLM builds their specs (what
        `check --engine vllm` sizes): Mamba-2 and short-convolution mixers get MambaSpec state, chunked
        layers their chunk. Any other class: the config's own layer kinds."""
        spec.require_layers()
        if S.architecture(spec) == S.DSV4:  # its caches are sized from the config (engines/vllm/dsv4.py)
            return dsv4_facts(spec)
        if S.architecture(spec) not in S.RULES:
            return super().budget_facts(spec)
        try:
            S.check_layer_types(spec)
            interp = S.interpret(spec)
        except Startup as exc:
            raise InputError(f"{spec.model_dir / 'config.json'}: vLLM {VERSION} refuses this config at start-up "
                             f"({exc}); `kvdoctor check --engine vllm` reports it") from None
        return budget_facts(spec, interp)

    def probes(self) -> Sequence[Probe]:
        from kvdoctor.engines.vllm.probe import PagedCacheProbe

        return (PagedCacheProbe(),)

    def dry_run(self) -> DryRunner:
        from kvdoctor.engines.vllm.dryrun import VllmDryRunner

        return VllmDryRunner()

    def report(self, plan: Plan[Any], observations: Mapping[str, Any]) -> dict[str, Any]:
        if plan.facts is None:
            return {}
        out = facts_json(plan.facts)
        if "vllm_paged" in observations:
            out["probe"] = observations["vllm_paged"]
        return {"vllm": out}


def plan(spec: ModelSpec, settings: VllmSettings) -> Plan[VllmFacts]:
    release = settings.release or VERSION
    versions = {"vllm": release}
    notes: list[str] = []
    arch = S.architecture(spec)
    derived, key = derived_max_model_len(spec)
    facts = VllmFacts(arch, False, True, "", None, derived, key, None, (), None, None)
    layers: tuple[LayerPlan, ...] = tuple(LayerPlan(l.index, None, "unknown") for l in spec.layers)
    try:  # vLLM's order: config stage (transformers, then vLLM's checks), model class, KV planning
        unknown = registry.unrecognized_type(spec.raw_config, release)
        if unknown is not None:
            raise unrecognized_model_type(unknown)
        if registry.needs_remote_code(spec.raw_config, release) and not settings.trust_remote_code:
            class_ref = str((spec.raw_config.get("auto_map") or {}).get("AutoConfig") or "")
            raise remote_code_not_trusted(str(spec.model_dir), class_ref.split("--")[0] if "--" in class_ref else None)
        spec.require_layers()  # past the config stage, vLLM reads the layers kvdoctor could not
        own_class = registry.reads_with_own_class(spec.raw_config.get("model_type"), release)
        if own_class and (spec.rejected is not None or hf_config.refuses_null_window(arch, spec.config)):
            notes.append(f"vLLM {release} reads model_type {spec.raw_config.get('model_type')!r} with a config class "
                         "of its own, not transformers': transformers' class refuses this config, but that is not "
                         "this release's check, and its own class's checks are not modelled (--dry-run runs them)")
        elif spec.rejected is not None:
            raise config_class_rejects(spec.rejected)
        if (hf_config.refuses_null_window(arch, spec.config) and not own_class) or (
                arch in S.STRICT_WINDOW_VLLM and "sliding_window" in spec.config and spec.config["sliding_window"] is None):
            raise strict_null_window()
        try:
            S.check_layer_types(spec)
        except Startup as exc:
            evidence = exc.refusal.evidence  # the length check as the release's own Qwen3.5 class runs it
            own = spec.model_type in S.QWEN3_5_TYPES and at(releases.QWEN3_5_OWN_CONFIG, release)
            if own and "layer_types" in evidence:
                raise layer_types_length_own_class(evidence["num_hidden_layers"], evidence["layer_types"]) from None
            raise
        if _text_config_left_a_dict(spec.raw_config):
            raise text_config_not_a_config(str(spec.raw_config.get("model_type")))
        unsupported = registry.architecture_refusal(spec.raw_config, release)
        if unsupported is not None:
            raise unsupported
        if spec.model_type in GEMMA4_TYPES and at(releases.GEMMA4_GLOBAL_HEAD_DIM, release):
            raise gemma4_global_head_dim()
        length = _max_model_len(spec, settings, derived, key)
        heads = spec.config.get("num_attention_heads")
        if heads is None:  # the class's own spelling (GPT-2's n_head), as the loader read it
            heads = next((layer.n_heads for layer in spec.layers if layer.n_heads), None)
        if isinstance(heads, int) and heads % settings.tensor_parallel_size:
            raise tp_heads(heads, settings.tensor_parallel_size)
        dtype = settings.kv_cache_dtype
        if dtype.startswith("nvfp4") and not dtype.endswith("_ds_mla") and _uses_mla(spec):
            raise nvfp4_with_mla()
        if (settings.mamba_block_size is not None and settings.mamba_block_size != length
                and settings.enable_prefix_caching is False):
            raise mamba_block_without_prefix_caching()
        prefix_caching = settings.enable_prefix_caching if settings.enable_prefix_caching is not None else (
            arch not in S.ATTENTION_FREE)
        needs_chunked = at(releases.MAMBA_CACHING_CHUNKED_PREFILL_TEXT, release)
        if settings.enable_chunked_prefill is False and prefix_caching and arch in S.MAMBA_CONFIG_HOOK and needs_chunked:
            raise chunked_prefill_for_mamba_caching(needs_chunked)
        hma, why = hma_decision(spec.config, settings)
        facts = msgspec.structs.replace(facts, hma=hma, hma_why=why, max_model_len=length, is_hybrid=arch in S.HYBRID)
        text_class = S.vision_tower_without_config(spec, registry.loaded_class(spec.raw_config, release))
        if text_class is not None:  # the model class stops while it is built
            raise vision_config_missing(text_class)
        if spec.model_type == "afmoe" and "layer_types" not in spec.config and registry.reads_with_own_class(
                spec.model_type, release):
            raise afmoe_layer_types_unset()  # while the model class is built
        relaid = S.as_release_reads(spec, release)
        own_layout = None if relaid is not None else (
            f"vLLM {release}'s own Qwen3NextConfig puts full attention on every fourth layer, and this config has no "
            "layer of one of the two kinds to take its geometry from")
        spec = relaid or spec
        interp = S.interpret(spec)
        backend = registry.resolution(spec.raw_config, release) == "transformers_backend"
        if backend and arch.endswith(S.GENERATING) and at(releases.TRANSFORMERS_BACKEND_PLANNED, release):
            interp = S.transformers_backend(spec, interp)
            facts = msgspec.structs.replace(facts, architecture=S.transformers_backend_class(spec))
        _check_rope_type(spec)
        groups_key = S.MAMBA2_GROUPS_KEY.get(arch)
        groups = spec.config.get(groups_key) if groups_key else None
        tp = settings.tensor_parallel_size
        if isinstance(groups, int) and groups > 1 and groups % tp:
            raise mamba2_groups_split(groups, tp, str(groups_key))
        is_hybrid = arch in S.HYBRID or (arch not in S.ATTENTION_FREE and any(l.spec == S.MAMBA for l in interp.layers))
        facts = msgspec.structs.replace(facts, model_window=interp.model_window, is_hybrid=is_hybrid,
                                    layer_types=interp.layer_types,
                                    hma_why=why if len({l.spec for l in interp.layers}) > 1 else
                                    why + "; every layer has the same spec class, so it changes nothing here")
        mode = settings_mode(settings, length, hma, checkpoint_kv_dtype(spec.raw_config))
        if interp.rule == "no_cache_config":  # Attention(cache_config=None): kv_cache_dtype "auto"
            mode = msgspec.structs.replace(mode, kv_cache_dtype="auto")
        mode = msgspec.structs.replace(mode, prefix_caching=prefix_caching)
        why_not = (own_layout or _unmodeled(spec, interp, release)) if interp.layers else (
            f"{arch or 'this model class'} builds no KV cache spec for any layer of this config")
        if why_not is None and arch == S.DSV4:
            try:
                head = dsv4.unsupported_compressor_head(spec.config)
                if head is not None:
                    raise dsv4_compressor_head(*head)
                return _plan_dsv4(spec, mode, facts, versions, notes)
            except InputError as exc:  # a config its caches cannot be read from: left to --dry-run, as below
                why_not = str(exc).partition(": ")[2] or str(exc)
        if why_not is None:
            try:
                bfacts = budget_facts(spec, interp)
            except InputError as exc:
                why_not = str(exc).partition(": ")[2] or str(exc)
        if why_not is not None and not hma and arch in S.MAMBA_CONFIG_HOOK - S.ATTENTION_FREE:
            # a hybrid the table leaves to --dry-run still has attention beside its Mamba state, which HMA off cannot
            # promote to one spec type (Zamba2, as Jamba and Falcon-H1 that the table plans)
            raise from_budget(EngineRefusal("ValueError", at(releases.PROMOTION_FAILED, release)), True)
        if why_not is not None:
            facts = msgspec.structs.replace(facts, unmodeled=why_not)
            return Plan("vllm", versions, layers, (), facts, (*notes, why_not))
        _check_vision_heads_split(spec, settings.tensor_parallel_size)
        _check_kv_heads_split(bfacts, settings.tensor_parallel_size)
        from kvdoctor.engines.vllm import budget as budget_vllm

        budget = budget_vllm.plan(bfacts, mode)
        notes += budget.notes
        layers = layer_plans(interp, bfacts, budget, hma)
        facts = msgspec.structs.replace(facts, block_size=budget.mode.block_size,
                                    groups=groups_of(budget, interp))
        if budget.error is not None:
            raise from_budget(budget.error, is_hybrid)
    except Startup as stop:
        return Plan("vllm", versions, layers, (_sourced(stop.refusal, release),), facts, tuple(notes))
    return Plan("vllm", versions, layers, (), facts, tuple(notes))


def _sourced(refusal: Refusal, release: str) -> Refusal:
    """The refusal with the line of the release's vLLM source that raises it."""
    return msgspec.structs.replace(refusal, source=releases.source(refusal.code, release, refusal.source or ""))


def _plan_dsv4(spec: ModelSpec, mode: budget_vllm.Mode, facts: VllmFacts, versions: dict[str, str],
               notes: list[str]) -> Plan[VllmFacts]:
    """DeepSeek-V4's caches, groups and admission check (engines/vllm/dsv4.py); its block sizes are the model's own,
    and its caches fp8_ds_mla whatever kv_cache_dtype says, as vLLM's model class builds them."""
    from kvdoctor.engines.vllm import budget as budget_vllm

    sizing = dsv4.size(dsv4.as_release_reads(spec.config, mode.release), mode.hma, mode.max_model_len,
                       mode.in_flight_tokens)
    labels = {dsv4.SLIDING_MLA: "windowed" if mode.hma else "mla", dsv4.MLA: "mla"}
    layers = tuple(LayerPlan(c.index, c.window, labels[c.spec], extra={
        "engine_spec": c.spec, "name": f"model.layers.{c.index}.{c.name}", "dtype": c.dtype, "num_kv_heads": 1,
        "head_size": c.head_size, "page_size_bytes": c.page, "block_size": c.block_size}) for c in sizing.specs)
    groups = tuple(Group(g[0].spec, tuple(c.index for c in g), g[0].block_size, sum(c.page for c in g),
                         g[0].window if g[0].spec == dsv4.SLIDING_MLA else None) for g in sizing.groups)
    facts = msgspec.structs.replace(facts, block_size=dsv4.COMPRESSED_BLOCK, groups=groups)
    if sizing.promoted and at(releases.SLIDING_MLA_PROMOTION_FAILS, mode.release):
        return Plan("vllm", versions, layers, (_sourced(sliding_mla_promotion().refusal, mode.release),),
                    msgspec.structs.replace(facts, groups=()), tuple(notes))
    budget = budget_vllm.plan(dsv4_facts(spec), mode)  # the pool and admission check `budget` and `fit` price
    if budget.error is not None:
        return Plan("vllm", versions, layers, (_sourced(from_budget(budget.error, False).refusal, mode.release),),
                    facts, tuple(notes))
    return Plan("vllm", versions, layers, (), facts, tuple(notes))


def dsv4_facts(spec: ModelSpec) -> ModelFacts:
    """DeepSeek-V4's budget facts: its compressed and sliding layers, and the config its caches are sized from
    (whatever layer_types says, vLLM reads the ratios itself: engines/vllm/dsv4.py `layer_ratios`)."""
    facts = facts_from_spec(spec, extra_kinds={COMPRESSED: "compressed"})
    facts.dsv4 = dict(spec.config)
    return facts


def _unmodeled(spec: ModelSpec, interp: S.Interpretation, release: str) -> str | None:
    """A model class missing from the table whose layers are not all attention (Mamba, convolution or
    no-op blocks): vLLM's shared fallback would give them attention specs, which would be a guess."""
    if interp.architecture in S.RULES:
        return None
    if interp.rule == "transformers_backend":
        return None
    if registry.resolution(spec.raw_config, release) == "transformers_backend":
        return (f"vLLM {release}'s registry has no {interp.architecture or 'architecture for this config'}: it would "
                "try its Transformers backend, which runs or refuses as transformers' own model class allows")
    if interp.architecture in S.NOT_PLANNED:
        why = S.not_planned(interp.architecture, release)
        return None if why is None else f"{interp.architecture} is not in kvdoctor's vLLM table: {why}"
    odd = sorted({l.kind for l in spec.layers if l.kind not in ATTENTION_KINDS})
    if not odd:
        return None
    return (f"{interp.architecture or 'this model class'} is not in kvdoctor's vLLM table, and it has "
            f"{', '.join(odd)} layers, whose specs vLLM's model class decides")


def _text_config_left_a_dict(raw: Mapping[str, Any]) -> bool:
    """A `text_config` under a top-level model_type that is the text model's own (a composite config whose
    outer type was replaced by the inner one): that text-only class keeps the mapping as a plain dict,
    which vLLM then takes for the text config. Asked of transformers' class only in that case."""
    text = raw.get("text_config")
    if not isinstance(text, dict) or text.get("model_type") != raw.get("model_type"):
        return False
    try:
        view = hf_config.read(str(raw.get("model_type")), dict(raw), attrs=("text_config",))
    except hf_config.Rejected:
        return False  # the class's own refusal is reported where kvdoctor reads the config
    return view is not None and isinstance(view.resolved.get("text_config"), dict)


# The scaling types vLLM 0.33.0's get_rope builds (layers/rotary_embedding/__init__.py), and the legacy names
# its config patching renames before the model is built ("su" -> longrope, "mrope" -> default).
VLLM_ROPE_TYPES = frozenset({"default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional", "ntk",
                             "deepseek_yarn", "deepseek_llama_scaling", "mllama4", "bailing_mrope", "openpangu",
                             "su", "mrope"})


def _rope_type(cfg: Mapping[str, Any]) -> Any:
    """The RoPE mapping's type (`rope_type`, or the legacy `type`), None without one."""
    for key in ("rope_parameters", "rope_scaling"):
        params = cfg.get(key)
        if isinstance(params, dict):
            return params.get("rope_type", params.get("type"))
    return None


def _check_rope_type(spec: ModelSpec) -> None:
    """The model class passes the config's RoPE mapping to get_rope while it is built (stage `specs`)."""
    rope_type = _rope_type(spec.config)
    if isinstance(rope_type, str) and rope_type not in VLLM_ROPE_TYPES:
        raise rope_type_unknown(rope_type, "rope_parameters" if "rope_parameters" in spec.config else "rope_scaling")


def _uses_mla(spec: ModelSpec) -> bool:
    """ModelConfig.use_mla: a DeepSeek-style latent attention (the config has a kv_lora_rank)."""
    return S.RULES.get(S.architecture(spec)) in ("mla", "kimi_linear") or bool(spec.config.get("kv_lora_rank"))


# The length keys vLLM reads from the text config object, in its order
# (transformers_utils/model_arch_config_convertor.py derive_max_model_len_and_key).
LENGTH_KEYS = (*POSITION_KEYS[:4], "model_max_length", "max_target_positions", "max_sequence_length",
               "max_seq_length", "seq_len")


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def length_values(spec: ModelSpec) -> dict[str, Any]:
    """The length keys as vLLM sees them. vLLM reads attributes of the transformers config object, so a
    config.json that gives none of them still has its configuration class's defaults (Gemma 3's text
    config: max_position_embeddings 131072). For a table family the class is asked only then: a config that
    names a key keeps the table families free of transformers (docs/model-semantics.md). A family whose
    class maps a key to its own spelling (ChatGLM's seq_length is also its max_position_embeddings) has both.
    A type outside the table is read through its class, whose attribute_map may alias a key."""
    family = family_for(spec.model_type)
    aliases = family.key_aliases(spec.config) if family is not None else {}
    values = {name: spec.config.get(name, spec.config.get(aliases.get(name, name))) for name in LENGTH_KEYS}
    given = {name: value for name, value in values.items() if _number(value)}
    if given and spec.semantics != "transformers":
        return given
    # GPT-J's max_position_embeddings reads n_positions: vLLM names the key it asked for
    try:
        view = hf_config.read(spec.model_type, spec.config, attrs=LENGTH_KEYS)
    except hf_config.Rejected:
        return given  # the class refuses the config: vLLM stops before it derives a length (VLM032 / VLM001)
    resolved = {name: view.resolved[name] for name in LENGTH_KEYS if _number(view.resolved.get(name))} if view else {}
    return resolved or given


def derived_max_model_len(spec: ModelSpec) -> tuple[float | None, str | None]:
    """The smallest of the position keys vLLM reads, times a RoPE factor of the types that do not
    already scale max_position_embeddings (config/model.py _get_and_verify_max_len)."""
    cfg = spec.config
    values = length_values(spec)
    best, key = None, None
    for name in LENGTH_KEYS:
        value = values.get(name)
        if value is not None and (best is None or value < best):
            best, key = value, name
    if isinstance(values.get("model_max_length"), int) and values["model_max_length"]:
        best, key = values["model_max_length"], "model_max_length"
    if best is None:
        return None, None
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type") or rope.get("type") if isinstance(rope, dict) else None
    factor = rope.get("factor") if isinstance(rope, dict) and rope_type not in ROPE_FACTOR_FREE else None
    if "gemma3" in spec.model_type:
        factor = None
    return float(best) * (factor or 1.0), key


def _max_model_len(spec: ModelSpec, settings: VllmSettings, derived: float | None, key: str | None) -> int | None:
    if settings.max_model_len is None:
        if derived is not None and _rope_type(spec.config) in ("longrope", "su"):
            # _get_and_verify_max_len: LongRoPE models default to original_max_position_embeddings (Phi-3.5's
            # 4096 of 131072) "to avoid performance degradation for shorter sequences"
            original = spec.config.get("original_max_position_embeddings")
            return int(original) if _number(original) else int(derived)
        return int(derived) if derived is not None else 2048
    if derived is not None and settings.max_model_len > derived:
        model_max = spec.config.get("model_max_length")
        if model_max is None or settings.max_model_len > model_max:
            raise max_model_len_over(settings.max_model_len, key or "max_position_embeddings", derived, model_max)
    return settings.max_model_len


def hma_decision(config: Mapping[str, Any], settings: VllmSettings) -> tuple[bool, str]:
    """VllmConfig.__post_init__ (config/vllm.py): the deploy flag wins; unset, vLLM turns the manager off
    itself for chunked local attention with EAGLE (env VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE
    defaults to 1 in 0.33.0, so chunked attention alone keeps it on)."""
    spec_cfg = settings.speculative_config
    eagle = spec_cfg is not None and spec_cfg.method in ("eagle", "eagle3", "mtp")
    needs_off = bool(config.get("attention_chunk_size")) and eagle
    if settings.disable_hybrid_kv_cache_manager is True:
        return False, "disabled by the deploy setting disable_hybrid_kv_cache_manager: true"
    if needs_off:
        if settings.disable_hybrid_kv_cache_manager is False:
            raise hma_forced_on()
        return False, "vLLM turns it off for chunked local attention with EAGLE-style speculation"
    return True, "on (vLLM's default)"


def checkpoint_kv_dtype(raw: Mapping[str, Any]) -> str | None:
    """The KV cache dtype a checkpoint's quantization_config asks for, which vLLM uses when kv_cache_dtype
    is auto: a compressed-tensors `kv_cache_scheme` (layers/attention/attention.py: fp8) or a ModelOpt
    `kv_cache_quant_algo` / `kv_cache_scheme` (utils/torch_utils.py get_kv_cache_quant_algo_string)."""
    qc = raw.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    method = str(qc.get("quant_method") or "")
    if method.startswith("modelopt"):
        nested = qc.get("quantization")
        inner: dict[str, Any] = nested if isinstance(nested, dict) else qc
        algo = (inner.get("kv_cache_scheme") or qc.get("kv_cache_scheme") or inner.get("kv_cache_quant_algo")
                or qc.get("kv_cache_quant_algo"))
        if isinstance(algo, dict):
            if algo.get("dynamic") is False and algo.get("num_bits") == 8 and algo.get("type") == "float":
                algo = "fp8"
            elif algo.get("num_bits") == 4 and algo.get("type") == "float":
                algo = "nvfp4"
            else:
                return None
        return {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}.get(algo.lower()) if isinstance(algo, str) else None
    if method == "compressed-tensors" and qc.get("kv_cache_scheme") is not None:
        return "fp8"
    return None


def settings_mode(settings: VllmSettings, length: int | None, hma: bool,
                  checkpoint_kv: str | None = None) -> budget_vllm.Mode:
    from kvdoctor.engines.vllm import budget as budget_vllm

    budget = settings.kv_budget_bytes
    kv_dtype = checkpoint_kv if settings.kv_cache_dtype == "auto" and checkpoint_kv else settings.kv_cache_dtype
    mode = budget_vllm.Mode(
        max_model_len=length or 2048, kv_budget_bytes=budget if budget is not None else UNBOUNDED,
        kv_cache_dtype=kv_dtype, tp=settings.tensor_parallel_size, hma=hma,
        prefix_caching=True if settings.enable_prefix_caching is None else settings.enable_prefix_caching,
        num_speculative_tokens=settings.num_speculative_tokens, block_size=settings.block_size,
        async_scheduling=settings.async_scheduling,
        release=settings.release or VERSION)
    overrides: dict[str, Any] = {k: v for k, v in (("max_num_batched_tokens", settings.max_num_batched_tokens),
                                   ("max_num_seqs", settings.max_num_seqs)) if v is not None}
    return msgspec.structs.replace(mode, **overrides)


def budget_facts(spec: ModelSpec, interp: S.Interpretation):
    """kvdoctor.engines.budget's facts with the layers as vLLM builds them (not as the model means them)."""
    state = {"kimi_linear": KDA, "nemotron_h": NO_ATTENTION, "lfm2": NO_ATTENTION, "jamba": NO_ATTENTION,
             "falcon_h1": NO_ATTENTION, "mamba1": NO_ATTENTION, "mamba2": NO_ATTENTION,
             "zamba2": NO_ATTENTION}.get(interp.rule, GDN)
    kinds = {S.FULL: FULL, S.SLIDING: SLIDING, S.CHUNKED: FULL, S.MLA: MLA, S.MAMBA: state}
    planned = {l.index: l for l in interp.layers}
    shadow = [msgspec.structs.replace(layer, kind=kinds[planned[layer.index].spec], window=planned[layer.index].window)
              if layer.index in planned else msgspec.structs.replace(layer, kind=NO_ATTENTION)
              for layer in spec.layers]
    facts = facts_from_spec(msgspec.structs.replace(spec, layers=shadow))
    if interp.rule == "nemotron_h":
        facts.mamba = mamba2_dims(spec)
    if interp.rule == "jamba":
        facts.mamba1 = jamba_dims(spec)
    if interp.rule == "falcon_h1":
        facts.mamba = falcon_h1_dims(spec, facts.serving_dtype)
    if interp.rule == "mamba2":
        facts.mamba = mamba2_class_dims(spec, facts.serving_dtype)
    if interp.rule == "zamba2":
        facts.mamba = zamba2_dims(spec, facts.serving_dtype)
    if interp.rule == "mamba1":
        facts.mamba1 = mamba1_class_dims(spec)
    if interp.rule == "lfm2":  # lfm2.py get_mamba_state_shape_from_config: conv_dim and conv_L_cache
        dim, kernel = spec.config.get("conv_dim") or spec.config.get("hidden_size"), spec.config.get("conv_L_cache")
        if not (isinstance(dim, int) and isinstance(kernel, int) and dim > 0 and kernel > 1):
            raise InputError("config.json: LFM2's conv_dim and conv_L_cache must be positive integers")
        facts.short_conv = ShortConvDims(dim, kernel)
    state_kind = facts.state_kind or "gdn"
    own = {layer.index: layer for layer in facts.layers}  # a layer's own KV geometry (Gemma-4's global layers)
    layers = []
    for plan_layer in interp.layers:
        kind = BUDGET_KINDS.get(plan_layer.spec, state_kind)
        window = plan_layer.chunk if plan_layer.spec == S.CHUNKED else plan_layer.window
        mine = own.get(plan_layer.index)
        geometry = (mine.kv_heads, mine.head_dim, mine.v_head_dim) if mine is not None else (None, None, None)
        if interp.rule == "mimo_v2":
            geometry = _mimo_v2_geometry(spec.config, plan_layer.spec == S.SLIDING)
        if interp.rule == "zamba2" and plan_layer.spec != S.MAMBA:
            geometry = _zamba2_attention(spec)
        if interp.rule == "expanded_mla":
            geometry = _expanded_mla_attention(spec)
        layers.append(Layer(plan_layer.index, kind, window, *geometry))
    facts.layers = layers
    return facts


def _check_kv_heads_split(facts, tp: int) -> None:
    """The model class's attention layers split KV heads across TP ranks, or replicate them when there
    are fewer heads than ranks; either way the two must divide (an AssertionError while it is built)."""
    for layer in facts.layers:
        heads = layer.kv_heads or facts.kv_heads
        if layer.kind in KV_HEAD_KINDS and heads and (heads % tp if heads >= tp else tp % heads):
            raise kv_heads_split(heads, tp, layer.index)


# Model classes whose vision tower splits its attention heads over the TP ranks (the default
# mm_encoder_tp_mode "weights"), asserting that the TP size divides them (glm4_1v.py)
VISION_TP_SPLIT = {"Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration"}


def _check_vision_heads_split(spec: ModelSpec, tp: int) -> None:
    vision = spec.raw_config.get("vision_config")
    heads = vision.get("num_heads") if isinstance(vision, dict) else None
    if S.architecture(spec) in VISION_TP_SPLIT and _number(heads) and heads > 0 and heads % tp:
        raise vision_heads_split(int(heads), tp)


def _mimo_v2_geometry(cfg: Mapping[str, Any], sliding: bool) -> tuple[Any, Any, Any]:
    """mimo_v2.py builds a layer's attention from the `swa_*` keys where hybrid_layer_pattern makes it
    sliding and from the plain keys elsewhere, whatever layer_types says (the loader follows layer_types)."""
    prefix = "swa_" if sliding else ""
    head = cfg.get(prefix + "head_dim")
    return cfg.get(prefix + "num_key_value_heads"), head, cfg.get(prefix + "v_head_dim") or head


def mamba2_dims(spec: ModelSpec) -> Mamba2Dims:
    """NemotronH's Mamba-2 mixer dims as nemotron_h.py reads them (get_mamba_state_shape_from_config), and
    the SSM state dtype NemotronHForCausalLMConfig sets (the config's mamba_ssm_cache_dtype, else float32)."""
    cfg = spec.config
    missing = [k for k in ("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel")
               if not isinstance(cfg.get(k), int) or cfg[k] <= 0]
    if missing:
        raise InputError(f"config.json: {', '.join(missing)} must be positive integers for Nemotron-H's Mamba state")
    ssm = cfg.get("mamba_ssm_cache_dtype")
    return Mamba2Dims(cfg["mamba_num_heads"], cfg["mamba_head_dim"], cfg["n_groups"], cfg["ssm_state_size"],
                      cfg["conv_kernel"], ssm if isinstance(ssm, str) and ssm != "auto" else "float32")


def falcon_h1_dims(spec: ModelSpec, model_dtype: str) -> Mamba2Dims:
    """Falcon-H1's Mamba-2 mixer as falcon_h1.py reads it (get_mamba_state_shape_from_config), with FalconH1Config's
    defaults: mamba_d_ssm channels (1024; None: mamba_expand x hidden_size) in mamba_n_heads heads of mamba_d_head
    ("auto": channels / heads; the class's validation holds heads x head to the channels), mamba_n_groups,
    mamba_d_state, mamba_d_conv. Both states are in the model dtype while mamba_cache_dtype and mamba_ssm_cache_dtype
    are auto (MambaStateDtypeCalculator.mamba2_state_dtype)."""
    cfg = spec.config
    channels = cfg.get("mamba_d_ssm", 1024)
    if channels is None:
        channels = (cfg.get("mamba_expand") or 2) * (cfg.get("hidden_size") or 0)
    values: dict[str, int] = {}
    for key, default in (("mamba_n_heads", 128), ("mamba_n_groups", 1), ("mamba_d_state", 256), ("mamba_d_conv", 4),
                         ("mamba_d_head", "auto")):
        value = cfg.get(key, default)
        if key == "mamba_d_head" and value == "auto" and isinstance(channels, int):
            value = channels // values["mamba_n_heads"]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InputError(f"config.json: {key} must be a positive integer for Falcon-H1's Mamba state")
        values[key] = value
    return Mamba2Dims(values["mamba_n_heads"], values["mamba_d_head"], values["mamba_n_groups"], values["mamba_d_state"],
                      values["mamba_d_conv"], model_dtype)


def _positive_ints(spec: ModelSpec, keys: tuple[tuple[str, int | None], ...], what: str) -> dict[str, int]:
    values: dict[str, int] = {}
    for key, default in keys:
        value = spec.config.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InputError(f"config.json: {key} must be a positive integer for {what}")
        values[key] = value
    return values


def mamba2_class_dims(spec: ModelSpec, model_dtype: str) -> Mamba2Dims:
    """Mamba2ForCausalLM's mixer as mamba2.py reads it (Mamba2Config's defaults where unset): num_heads x head_dim
    channels (expand x hidden_size), n_groups, state_size, conv_kernel; both states in the model dtype."""
    v = _positive_ints(spec, (("num_heads", 128), ("head_dim", 64), ("n_groups", 1), ("state_size", 128),
                              ("conv_kernel", 4)), "Mamba-2's state")
    return Mamba2Dims(v["num_heads"], v["head_dim"], v["n_groups"], v["state_size"], v["conv_kernel"], model_dtype)


def zamba2_dims(spec: ModelSpec, model_dtype: str) -> Mamba2Dims:
    """Zamba2's mixer as zamba2.py reads it (get_mamba_state_shape_from_config) off Zamba2Config, which derives
    mamba_headdim as mamba_expand x hidden_size / n_mamba_heads whatever config.json says (defaults: expand 2,
    8 heads, mamba_ngroups 1, mamba_d_state 64, mamba_d_conv 4); both states in the model dtype."""
    v = _positive_ints(spec, (("hidden_size", None), ("mamba_expand", 2), ("n_mamba_heads", 8), ("mamba_ngroups", 1),
                              ("mamba_d_state", 64), ("mamba_d_conv", 4)), "Zamba2's Mamba state")
    head_dim = v["mamba_expand"] * v["hidden_size"] // v["n_mamba_heads"]
    if head_dim <= 0:
        raise InputError("config.json: n_mamba_heads must not exceed mamba_expand x hidden_size for Zamba2's Mamba state")
    return Mamba2Dims(v["n_mamba_heads"], head_dim, v["mamba_ngroups"], v["mamba_d_state"], v["mamba_d_conv"],
                      model_dtype)


def _zamba2_attention(spec: ModelSpec) -> tuple[int, int, int]:
    """zamba2.py's shared attention: num_attention_heads query heads and as many KV heads (its Attention is built
    without num_kv_heads), of Zamba2Config's attention_head_dim, 2 x hidden_size / heads."""
    v = _positive_ints(spec, (("hidden_size", None), ("num_attention_heads", 32)), "Zamba2's attention")
    head = 2 * v["hidden_size"] // v["num_attention_heads"]
    if head <= 0:
        raise InputError("config.json: num_attention_heads must not exceed 2 x hidden_size for Zamba2's attention")
    return v["num_attention_heads"], head, head


def _expanded_mla_attention(spec: ModelSpec) -> tuple[int, int, int]:
    """minicpm3.py's Attention: num_attention_heads KV heads of qk_nope_head_dim + qk_rope_head_dim, values padded to
    the same width (its keys and values are the latent's up-projections)."""
    v = _positive_ints(spec, (("num_attention_heads", None), ("qk_nope_head_dim", None), ("qk_rope_head_dim", None)),
                       "MiniCPM3's attention")
    head = v["qk_nope_head_dim"] + v["qk_rope_head_dim"]
    return v["num_attention_heads"], head, head


def mamba1_class_dims(spec: ModelSpec) -> Mamba1Dims:
    """MambaForCausalLM's mixer (mamba.py, also Falcon-Mamba's): intermediate_size channels, state_size, conv_kernel
    (MambaConfig's defaults where unset: expand x hidden_size, 16, 4)."""
    cfg = spec.config
    default = (cfg.get("expand") or 2) * (cfg.get("hidden_size") or 0) or None
    v = _positive_ints(spec, (("intermediate_size", default), ("state_size", 16), ("conv_kernel", 4)),
                       "Mamba's state")
    return Mamba1Dims(v["intermediate_size"], v["state_size"], v["conv_kernel"])


def jamba_dims(spec: ModelSpec) -> Mamba1Dims:
    """Jamba's Mamba-1 mixer as jamba.py reads it (get_mamba_state_shape_from_config): mamba_expand x
    hidden_size channels, mamba_d_state, mamba_d_conv (JambaConfig's defaults 2, 16, 4 where unset)."""
    cfg = spec.config
    values: dict[str, int] = {}
    for key, default in (("mamba_expand", 2), ("hidden_size", None), ("mamba_d_state", 16), ("mamba_d_conv", 4)):
        value = cfg.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InputError(f"config.json: {key} must be a positive integer for Jamba's Mamba state")
        values[key] = value
    return Mamba1Dims(values["mamba_expand"] * values["hidden_size"], values["mamba_d_state"], values["mamba_d_conv"])


def layer_plans(interp: S.Interpretation, facts, budget, hma: bool) -> tuple[LayerPlan, ...]:
    info = budget.sizing
    assert info is not None  # sized: the start-up checks refused heads that TP does not divide before the plan
    block = info.block_size
    dtype = _kv_dtype(facts, budget.mode.kv_cache_dtype)
    by_index = {l.index: l for l in facts.layers}
    out = []
    for layer in interp.layers:
        extra: dict[str, Any] = {"engine_spec": layer.spec, "dtype": dtype}
        if layer.spec == S.MAMBA:
            page = info.state_padded or info.state_bytes or None
            extra.update(num_kv_heads=None, head_size=None, page_size_bytes=page,
                         state_shapes=[t.shape for t in info.state_tensors])
        else:
            heads, head_size = info.layer_geometry.get(layer.index) or (info.kv_heads_per_rank, info.head_size)
            per_token = info.bytes_per_token * heads * head_size // (info.kv_heads_per_rank * info.head_size)
            if layer.spec != S.MLA:  # engines.vllm.budget's head_size counts K and V; vLLM's spec names each
                own = by_index.get(layer.index)
                key = (own.head_dim if own is not None and own.head_dim else None) or facts.head_dim
                key = key if isinstance(key, int) and 0 < key < head_size else head_size // 2
                if head_size - key != key:
                    extra["head_size_v"] = head_size - key  # MiMo-V2: keys of 192, values of 128
                head_size = key
            extra.update(num_kv_heads=heads, head_size=head_size, page_size_bytes=block * per_token,
                         block_size=block)
        if layer.chunk:
            extra["attention_chunk_size"] = layer.chunk
        label = CACHE_LABELS[layer.spec]
        if not hma and layer.spec in (S.SLIDING, S.CHUNKED) and _promoted(interp):
            label = "full"  # HMA off: the window still bounds compute, the cache is reserved full-length
        window = layer.window if layer.spec == S.SLIDING else layer.chunk
        out.append(LayerPlan(layer.index, window, label, extra=extra))
    return tuple(out)


def _promoted(interp: S.Interpretation) -> bool:
    kinds = {l.spec for l in interp.layers}
    return S.FULL in kinds and bool(kinds & {S.SLIDING, S.CHUNKED})


def _kv_dtype(facts, kv_cache_dtype: str) -> str:
    if kv_cache_dtype == "auto":
        return facts.serving_dtype
    return "uint8" if kv_cache_dtype.startswith("fp8") else kv_cache_dtype


def groups_of(budget, interp: S.Interpretation) -> tuple[Group, ...]:
    indices = [l.index for l in interp.layers]
    return tuple(Group(g.spec.cls, tuple(indices[p] for p in g.layers), g.spec.block_size, g.spec.page,
                       g.spec.window if g.spec.cls == "SlidingWindowSpec" else None)
                 for g in (budget.sizing.groups if budget.sizing else ()))


def facts_json(facts: VllmFacts) -> dict[str, Any]:
    return {"architecture": facts.architecture, "is_hybrid": facts.is_hybrid,
            "hma": {"on": facts.hma, "why": facts.hma_why}, "max_model_len": facts.max_model_len,
            "derived_max_model_len": facts.derived_max_model_len, "derived_from": facts.derived_from,
            "block_size": facts.block_size, "platform": facts.platform, "model_window": facts.model_window,
            "modeled": facts.unmodeled is None, "unmodeled": facts.unmodeled,
            "groups": [{"spec": g.spec, "layer_ids": list(g.layer_ids), "block_size": g.block_size,
                        "page_bytes": g.page_bytes, "window": g.window} for g in facts.groups]}
