"""Model architectures: the numbers the predictor needs, and where they come from.

A :class:`ModelArch` holds the shape of a transformer (layers, widths, heads, experts, MLA ranks)
and derives parameter counts, KV-cache size and the list of linear layers from it with exact
integer arithmetic. Architectures come from three places, all offline:

* the shipped catalogue (``datasets/models/catalogue.json``), looked up by name or alias;
* a Hugging Face ``config.json`` (a file path or a directory holding one);
* a mapping of explicit architecture numbers (the JobSpec ``model`` object).

:func:`resolve_model` accepts any of these.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from predictor._paths import datasets_dir
from predictor.exceptions import SpecError, UnknownModelError

__all__ = [
    "EXPLICIT_KEYS",
    "LORA_TARGETS",
    "ModelArch",
    "catalogue",
    "catalogue_aliases",
    "from_hf_config",
    "load_hf_config",
    "resolve_model",
]

#: Keys of the explicit-architecture object in the JobSpec contract (DESIGN.md).
EXPLICIT_KEYS: tuple[str, ...] = (
    "name",
    "n_layers",
    "hidden_size",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "tie_embeddings",
    "n_experts",
    "n_active_experts",
    "params_b",
)

#: Values accepted by :meth:`ModelArch.lora_params`.
LORA_TARGETS: tuple[str, ...] = ("all_linear", "attention", "qv")

_NORMS = ("rmsnorm", "layernorm")
_POSITIONS = ("rope", "learned", "alibi")
_ATTN_NAMES = frozenset(
    {"q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj"}
)
_QV_NAMES = frozenset({"q_proj", "v_proj", "q_b_proj", "kv_b_proj"})
# Families whose attention has q/k/v biases but no output-projection bias.
_NO_O_BIAS_FAMILIES = frozenset({"qwen2", "qwen2_moe"})
# Families with four norms per block (pre/post attention, pre/post MLP).
_FOUR_NORM_FAMILIES = frozenset({"gemma2", "gemma3"})
# Families with per-head RMSNorm on queries and keys.
_QK_NORM_FAMILIES = frozenset({"qwen3", "qwen3_moe", "gemma3"})
# Families with one learned attention-sink logit per head and layer.
_SINK_FAMILIES = frozenset({"gpt_oss"})
# Families whose MoE router has a bias (gpt-oss) or a score-correction bias (DeepSeek-V3).
_ROUTER_BIAS_FAMILIES = frozenset({"gpt_oss", "deepseek_v3"})


# Integer architecture fields, by the check __post_init__ applies (and that explicit model
# objects are coerced with).
_POSITIVE_INT_FIELDS: tuple[str, ...] = (
    "n_layers",
    "hidden_size",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "n_experts",
    "n_active_experts",
    "max_position_embeddings",
)
_OPTIONAL_POSITIVE_INT_FIELDS: tuple[str, ...] = (
    "moe_intermediate_size",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
)
_NON_NEGATIVE_INT_FIELDS: tuple[str, ...] = ("n_shared_experts", "n_dense_layers")


@dataclass(frozen=True, slots=True)
class ModelArch:
    """Architecture numbers of one transformer model.

    ``params_b`` is the *published* total parameter count in billions (from ``source``), kept for
    checking; every computed count comes from the shape fields.
    """

    name: str
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP width
    vocab_size: int
    tie_embeddings: bool = False
    n_experts: int = 1  # routed experts; 1 = dense model
    n_active_experts: int = 1  # routed experts used per token
    params_b: float | None = None  # PUBLISHED total parameter count in billions (from the source)
    gated_mlp: bool = True  # SwiGLU/GeGLU (3 matrices) vs plain GELU MLP (2 matrices)
    moe_intermediate_size: int | None = None  # expert width when it differs from intermediate_size
    n_shared_experts: int = 0
    n_dense_layers: int = 0  # leading dense layers in MoE models (DeepSeek first_k_dense_replace)
    attention_bias: bool = False
    mlp_bias: bool = False
    norm: str = "rmsnorm"  # "rmsnorm" | "layernorm"
    position: str = "rope"  # "rope" | "learned" | "alibi"
    max_position_embeddings: int = 4096
    kv_lora_rank: int | None = None  # MLA (DeepSeek-V2/V3); None = ordinary (GQA/MHA) attention
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    encoder_only: bool = False  # BERT-style (no KV cache growth, no lm head beyond tied)
    family: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        for field in _POSITIVE_INT_FIELDS:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SpecError(
                    f"model {self.name!r}: {field} must be a positive integer, got {value!r}"
                )
        for field in _OPTIONAL_POSITIVE_INT_FIELDS:
            value = getattr(self, field)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0
            ):
                raise SpecError(
                    f"model {self.name!r}: {field} must be a positive integer or null, "
                    f"got {value!r}"
                )
        for field in _NON_NEGATIVE_INT_FIELDS:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(
                    f"model {self.name!r}: {field} must be a non-negative integer, got {value!r}"
                )
        if self.n_active_experts > self.n_experts:
            raise SpecError(
                f"model {self.name!r}: n_active_experts ({self.n_active_experts}) exceeds "
                f"n_experts ({self.n_experts})"
            )
        if self.n_heads % self.n_kv_heads != 0:
            raise SpecError(
                f"model {self.name!r}: n_heads ({self.n_heads}) must be a multiple of "
                f"n_kv_heads ({self.n_kv_heads})"
            )
        if self.n_dense_layers > self.n_layers:
            raise SpecError(
                f"model {self.name!r}: n_dense_layers ({self.n_dense_layers}) exceeds "
                f"n_layers ({self.n_layers})"
            )
        if self.norm not in _NORMS:
            raise SpecError(f"model {self.name!r}: norm must be one of {_NORMS}, got {self.norm!r}")
        if self.position not in _POSITIONS:
            raise SpecError(
                f"model {self.name!r}: position must be one of {_POSITIONS}, got {self.position!r}"
            )
        if self.params_b is not None and not self.params_b > 0:
            raise SpecError(
                f"model {self.name!r}: params_b must be positive or null, got {self.params_b!r}"
            )
        if self.kv_lora_rank is not None and (
            self.qk_rope_head_dim is None or self.qk_nope_head_dim is None
        ):
            raise SpecError(
                f"model {self.name!r}: MLA (kv_lora_rank set) also needs qk_rope_head_dim and "
                "qk_nope_head_dim"
            )

    # ----------------------------------------------------------------- structure helpers
    @property
    def is_moe(self) -> bool:
        """True when the model routes tokens to experts."""
        return self.n_experts > 1

    @property
    def uses_mla(self) -> bool:
        """True for multi-head latent attention (DeepSeek-V2/V3)."""
        return self.kv_lora_rank is not None

    @property
    def n_moe_layers(self) -> int:
        """Blocks whose MLP is a mixture of experts (0 for dense models)."""
        return self.n_layers - self.n_dense_layers if self.is_moe else 0

    @property
    def n_dense_mlp_layers(self) -> int:
        """Blocks with an ordinary dense MLP."""
        return self.n_layers - self.n_moe_layers

    @property
    def expert_intermediate_size(self) -> int:
        """Width of one routed (and shared) expert."""
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def n_params_b(self) -> float:
        """Computed total parameters, in billions."""
        return self.total_params() / 1e9

    @property
    def n_active_params_b(self) -> float:
        """Computed parameters used per token, in billions."""
        return self.active_params() / 1e9

    def _mla_dims(self) -> tuple[int, int, int, int]:
        assert self.kv_lora_rank is not None
        rope = self.qk_rope_head_dim or 0
        nope = self.qk_nope_head_dim or 0
        v_dim = self.v_head_dim or nope
        return self.kv_lora_rank, rope, nope, v_dim

    def _attention_linears(self) -> list[tuple[str, int, int]]:
        h = self.hidden_size
        if self.uses_mla:
            kv_rank, rope, nope, v_dim = self._mla_dims()
            q_out = self.n_heads * (nope + rope)
            out: list[tuple[str, int, int]] = []
            if self.q_lora_rank is not None:
                out += [("q_a_proj", h, self.q_lora_rank), ("q_b_proj", self.q_lora_rank, q_out)]
            else:
                out.append(("q_proj", h, q_out))
            out += [
                ("kv_a_proj", h, kv_rank + rope),
                ("kv_b_proj", kv_rank, self.n_heads * (nope + v_dim)),
                ("o_proj", self.n_heads * v_dim, h),
            ]
            return out
        q_out = self.n_heads * self.head_dim
        kv_out = self.n_kv_heads * self.head_dim
        return [
            ("q_proj", h, q_out),
            ("k_proj", h, kv_out),
            ("v_proj", h, kv_out),
            ("o_proj", q_out, h),
        ]

    def _mlp_linears(self, width: int) -> list[tuple[str, int, int]]:
        h = self.hidden_size
        if self.gated_mlp:
            return [("gate_proj", h, width), ("up_proj", h, width), ("down_proj", width, h)]
        return [("up_proj", h, width), ("down_proj", width, h)]

    def linear_layers(self, active_only: bool = False) -> list[tuple[str, int, int, int]]:
        """Model-wide linear weight groups as ``(name, in_features, out_features, count)``.

        ``count`` is how many such matrices the whole model holds (attention: one per layer;
        routed experts: MoE layers × experts). With ``active_only`` the routed-expert counts are
        MoE layers × ``n_active_experts``: the matrices one token passes through, which is what
        a FLOP count needs. Routed-expert names start with ``expert_``, shared-expert names with
        ``shared_``; the MoE router is ``router``. ``lm_head`` comes last and is listed even when
        tied to the input embedding (the matmul still runs); encoder-only models have none.
        Fused projections (GPT-2 ``c_attn``, Phi-3 ``qkv_proj``) are listed split.
        """
        out: list[tuple[str, int, int, int]] = [
            (name, i, o, self.n_layers) for name, i, o in self._attention_linears()
        ]
        if self.n_dense_mlp_layers:
            out += [
                (name, i, o, self.n_dense_mlp_layers)
                for name, i, o in self._mlp_linears(self.intermediate_size)
            ]
        if self.n_moe_layers:
            width = self.expert_intermediate_size
            per_layer = self.n_active_experts if active_only else self.n_experts
            out.append(("router", self.hidden_size, self.n_experts, self.n_moe_layers))
            out += [
                (f"expert_{name}", i, o, self.n_moe_layers * per_layer)
                for name, i, o in self._mlp_linears(width)
            ]
            if self.n_shared_experts:
                out += [
                    (f"shared_{name}", i, o, self.n_moe_layers * self.n_shared_experts)
                    for name, i, o in self._mlp_linears(width)
                ]
        if not self.encoder_only:
            out.append(("lm_head", self.hidden_size, self.vocab_size, 1))
        return out

    # ----------------------------------------------------------------- parameter counts
    def embedding_params(self) -> int:
        """Input embedding + untied lm head + learned position (and BERT token-type) embeddings."""
        n = self.vocab_size * self.hidden_size
        if not self.tie_embeddings and not self.encoder_only:
            n += self.vocab_size * self.hidden_size
        if self.position == "learned":
            n += self.max_position_embeddings * self.hidden_size
        if self.encoder_only:
            n += 2 * self.hidden_size  # BERT token-type embeddings (type_vocab_size = 2)
        return n

    def _norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    def _attention_params(self) -> int:
        """Attention weights, biases and norms inside one block."""
        n = sum(i * o for _, i, o in self._attention_linears())
        if self.uses_mla:
            kv_rank, _, _, _ = self._mla_dims()
            n += kv_rank + (self.q_lora_rank or 0)  # kv_a_layernorm, q_a_layernorm
            if self.attention_bias:
                n += sum(o for _, _, o in self._attention_linears())
        elif self.attention_bias:
            n += (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
            if self.family not in _NO_O_BIAS_FAMILIES:
                n += self.hidden_size
        if self.family in _QK_NORM_FAMILIES:
            n += 2 * self.head_dim
        if self.family in _SINK_FAMILIES:
            n += self.n_heads
        return n

    def _mlp_params(self, width: int) -> int:
        n = sum(i * o for _, i, o in self._mlp_linears(width))
        if self.mlp_bias:
            n += sum(o for _, _, o in self._mlp_linears(width))
        return n

    def _block_norm_params(self) -> int:
        per_block = 4 if self.family in _FOUR_NORM_FAMILIES else 2
        return per_block * self._norm_params()

    def _router_params(self) -> int:
        n = self.hidden_size * self.n_experts
        if self.family in _ROUTER_BIAS_FAMILIES:
            n += self.n_experts
        return n

    def _other_params(self) -> int:
        """Final norm, BERT embedding norm and pooler."""
        if self.encoder_only:
            return self._norm_params() + self.hidden_size * self.hidden_size + self.hidden_size
        return self._norm_params()

    def _non_expert_params(self) -> int:
        n = self.n_layers * (self._attention_params() + self._block_norm_params())
        n += self.n_dense_mlp_layers * self._mlp_params(self.intermediate_size)
        n += self.n_moe_layers * self._router_params()
        n += self.embedding_params() + self._other_params()
        return n

    def expert_params(self) -> int:
        """Parameters of one routed expert (weights and biases)."""
        return self._mlp_params(self.expert_intermediate_size) if self.is_moe else 0

    def total_params(self) -> int:
        """Every parameter: embeddings, untied lm head, blocks, norms, biases, all experts."""
        n = self._non_expert_params()
        n += self.n_moe_layers * (self.n_experts + self.n_shared_experts) * self.expert_params()
        return n

    def active_params(self, *, include_input_embedding: bool = True) -> int:
        """Parameters touched per token: everything but the routed experts not chosen.

        Equal to :meth:`total_params` for dense models. With ``include_input_embedding=False``
        the input-embedding table (a lookup, not a matmul) is left out, which is the convention
        of OpenAI's gpt-oss active counts and the right one for FLOP estimates; the lm head stays
        in either way (tied or not, it is a matmul).
        """
        n = self._non_expert_params()
        n += (
            self.n_moe_layers
            * (self.n_active_experts + self.n_shared_experts)
            * self.expert_params()
        )
        if not include_input_embedding:
            n -= self.vocab_size * self.hidden_size
            if self.tie_embeddings and not self.encoder_only:
                n += self.vocab_size * self.hidden_size  # the shared table is the lm head
        return n

    def non_embedding_params(self) -> int:
        """:meth:`total_params` without :meth:`embedding_params`."""
        return self.total_params() - self.embedding_params()

    # ----------------------------------------------------------------- KV cache
    def kv_elems_per_token_per_layer(self) -> int:
        """Elements one token adds to the KV cache in one layer.

        ``2 * n_kv_heads * head_dim`` for MHA/GQA; for MLA the compressed latent plus the shared
        rope key (``kv_lora_rank + qk_rope_head_dim``), as vLLM stores it. Encoder-only models
        keep no cache: 0.
        """
        if self.encoder_only:
            return 0
        if self.uses_mla:
            kv_rank, rope, _, _ = self._mla_dims()
            return kv_rank + rope
        return 2 * self.n_kv_heads * self.head_dim

    def kv_elems_per_token(self) -> int:
        """Elements one token adds to the KV cache across all layers."""
        return self.n_layers * self.kv_elems_per_token_per_layer()

    # ----------------------------------------------------------------- LoRA
    def lora_params(self, rank: int, target: str) -> int:
        """Trainable LoRA parameters: ``rank * (in + out) * count`` over the targeted linears.

        ``target``: ``all_linear`` (every linear in the blocks, routers and experts included,
        not the lm head), ``attention`` (q, k, v, o and the MLA projections) or ``qv`` (q and v;
        for MLA ``q_b_proj``/``q_proj`` and ``kv_b_proj``).
        """
        if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
            raise SpecError(f"lora rank must be a positive integer, got {rank!r}")
        if target not in LORA_TARGETS:
            raise SpecError(f"unknown lora target {target!r}; use one of {', '.join(LORA_TARGETS)}")
        total = 0
        for name, i, o, count in self.linear_layers():
            if name == "lm_head":
                continue
            if (
                target == "all_linear"
                or (target == "attention" and name in _ATTN_NAMES)
                or (target == "qv" and name in _QV_NAMES)
            ):
                total += rank * (i + o) * count
        return total

    # ----------------------------------------------------------------- serialisation
    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready."""
        return dataclasses.asdict(self)


_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ModelArch))
_EXTRA_KEYS: tuple[str, ...] = tuple(k for k in _FIELDS if k not in EXPLICIT_KEYS)
_INT_FIELDS = frozenset(
    _POSITIVE_INT_FIELDS + _OPTIONAL_POSITIVE_INT_FIELDS + _NON_NEGATIVE_INT_FIELDS
)
_CATALOGUE_META_KEYS = frozenset({"aliases", "params_source"})

_NOT_FOUND_HINT = (
    "Use a catalogue name (snugfit models lists them), a path to a Hugging Face config.json, "
    "or an object with explicit architecture numbers"
)


# --------------------------------------------------------------------- catalogue
def _catalogue_path() -> Path:
    return datasets_dir() / "models" / "catalogue.json"


@lru_cache(maxsize=1)
def _load_catalogue() -> tuple[dict[str, ModelArch], dict[str, str]]:
    path = _catalogue_path()
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise SpecError(f"model catalogue not found at {path}; set SNUGFIT_DATASETS") from exc
    if not isinstance(rows, list):
        raise SpecError(f"{path}: expected a JSON list of model objects")
    models: dict[str, ModelArch] = {}
    aliases: dict[str, str] = {}
    for row in rows:
        if not isinstance(row, dict) or "name" not in row:
            raise SpecError(f"{path}: every entry must be an object with a 'name'")
        unknown = sorted(set(row) - set(_FIELDS) - _CATALOGUE_META_KEYS)
        if unknown:
            raise SpecError(f"{path}: model {row['name']!r} has unknown keys {unknown}")
        arch = ModelArch(**{k: v for k, v in row.items() if k in _FIELDS})
        key = arch.name.lower()
        if key in models:
            raise SpecError(f"{path}: duplicate model name {arch.name!r}")
        models[key] = arch
        for alias in row.get("aliases", []):
            aliases[str(alias).lower()] = key
    return models, aliases


def catalogue() -> dict[str, ModelArch]:
    """The shipped model catalogue, keyed by lowercase name (loaded once, then cached)."""
    return dict(_load_catalogue()[0])


def catalogue_aliases() -> dict[str, str]:
    """Lowercase alias (Hugging Face repo id) → catalogue name."""
    return dict(_load_catalogue()[1])


# Suffixes that name a fine-tune with the base model's architecture.
_VARIANT_SUFFIX = re.compile(r"-(instruct|chat|it|hf|base)(-\d{4})?$")


def _lookup_name(value: str) -> ModelArch | None:
    models, aliases = _load_catalogue()
    key = value.strip().lower()
    candidates = [key]
    if "/" in key:
        candidates.append(key.rsplit("/", 1)[1])
    for cand in list(candidates):
        stripped = cand
        while True:
            shorter = _VARIANT_SUFFIX.sub("", stripped)
            if shorter == stripped:
                break
            stripped = shorter
            candidates.append(stripped)
    for cand in candidates:
        if cand in models:
            return models[cand]
        if cand in aliases:
            return models[aliases[cand]]
        for prefix in ("meta-",):
            if cand.startswith(prefix) and cand[len(prefix) :] in models:
                return models[cand[len(prefix) :]]
    return None


def _hf_cache_config(repo_id: str) -> Path | None:
    """``config.json`` of ``repo_id`` in the local Hugging Face cache, if one is there."""
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo_id):
        return None
    roots = []
    if os.environ.get("HF_HUB_CACHE"):
        roots.append(Path(os.environ["HF_HUB_CACHE"]))
    hf_home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    roots.append(Path(hf_home) / "hub")
    folder = "models--" + repo_id.replace("/", "--")
    for root in roots:
        snapshots = root / folder / "snapshots"
        if snapshots.is_dir():
            for snap in sorted(snapshots.iterdir()):
                cfg = snap / "config.json"
                if cfg.is_file():
                    return cfg
    return None


def load_hf_config(path: str | os.PathLike[str]) -> ModelArch:
    """Read a Hugging Face ``config.json`` (or a directory holding one) offline."""
    from .limits import MAX_CONFIG_BYTES

    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    try:
        with p.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise SpecError(
                f"{str(p)!r} is larger than {MAX_CONFIG_BYTES >> 20} MiB, so it is not a Hugging "
                "Face config.json; point `model` at the model's config.json"
            )
        config = json.loads(data.decode("utf-8", "replace"))
    except FileNotFoundError as exc:
        raise UnknownModelError(f"no Hugging Face config.json at {str(p)!r}") from exc
    except RecursionError:
        raise SpecError(f"Hugging Face config {str(p)!r} is nested too deeply") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"cannot read Hugging Face config {str(p)!r}: {exc}") from exc
    if not isinstance(config, dict):
        raise SpecError(f"{str(p)!r} is not a JSON object")
    name = config.get("_name_or_path") or p.parent.name or "custom"
    arch = from_hf_config(config, name=str(name))
    return dataclasses.replace(arch, source=str(p.resolve()))


def resolve_model(value: str | os.PathLike[str] | Mapping[str, Any] | ModelArch) -> ModelArch:
    """Turn a catalogue name/alias, a config.json path or an explicit mapping into a ModelArch."""
    if isinstance(value, ModelArch):
        return value
    if isinstance(value, Mapping):
        return _from_explicit(value)
    if isinstance(value, os.PathLike):
        return load_hf_config(value)
    if not isinstance(value, str):
        raise SpecError(
            f"model must be a name, a config.json path or an object, got {type(value).__name__}"
        )
    text = value.strip()
    if not text:
        raise UnknownModelError(f"empty model name. {_NOT_FOUND_HINT}")
    path = Path(text).expanduser()
    try:
        is_config = path.is_file() or (path.is_dir() and (path / "config.json").is_file())
    except OSError:  # a name longer than the file system allows (ENAMETOOLONG) is no path
        is_config = False
    if is_config:
        return load_hf_config(path)
    found = _lookup_name(text)
    if found is not None:
        return found
    try:
        cached = _hf_cache_config(text)
    except OSError:
        cached = None
    if cached is not None:
        return load_hf_config(cached)
    if path.suffix == ".json" or text.startswith((".", "/", "~")):
        raise UnknownModelError(
            f"unknown model {text!r}: no such config.json file or directory. {_NOT_FOUND_HINT}"
        )
    models, aliases = _load_catalogue()
    key = text.lower()
    pool = list(models) + list(aliases)
    close = difflib.get_close_matches(key, pool, n=3, cutoff=0.6)
    if not close and "/" in key:
        close = difflib.get_close_matches(key.rsplit("/", 1)[1], pool, n=3, cutoff=0.6)
    suggestion = ""
    if close:
        names = list(dict.fromkeys(aliases.get(c, c) for c in close))
        suggestion = " did you mean " + " or ".join(repr(n) for n in names) + "?"
    raise UnknownModelError(f"unknown model {text!r};{suggestion} {_NOT_FOUND_HINT}")


# --------------------------------------------------------------------- explicit numbers
def _as_int(key: str, value: Any, *, minimum: int = 1) -> int:
    if isinstance(value, bool):
        raise SpecError(f"model.{key} must be an integer, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise SpecError(f"model.{key} must be an integer, got {value!r}")
    if value < minimum:
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise SpecError(f"model.{key} must be {what}, got {value}")
    return value


def _from_explicit(data: Mapping[str, Any]) -> ModelArch:
    unknown = [k for k in data if k not in _FIELDS]
    if unknown:
        raise SpecError(
            f"unknown model key {unknown[0]!r}; allowed keys: {', '.join(EXPLICIT_KEYS)} "
            f"(advanced: {', '.join(_EXTRA_KEYS)})"
        )
    required = ("n_layers", "hidden_size", "n_heads", "intermediate_size", "vocab_size")
    missing = [k for k in required if data.get(k) is None]
    if missing:
        raise SpecError(
            f"model object is missing {', '.join(missing)}; an explicit model needs "
            f"{', '.join(required)} (optional: n_kv_heads, head_dim, tie_embeddings, "
            "n_experts, n_active_experts, params_b, name)"
        )
    kw: dict[str, Any] = {}
    for key, value in data.items():
        if value is None:
            continue
        if key in _INT_FIELDS:
            minimum = 0 if key in ("n_shared_experts", "n_dense_layers") else 1
            kw[key] = _as_int(key, value, minimum=minimum)
        elif key == "params_b":
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise SpecError(f"model.params_b must be a positive number, got {value!r}")
            kw[key] = float(value)
        elif key in ("tie_embeddings", "gated_mlp", "attention_bias", "mlp_bias", "encoder_only"):
            if not isinstance(value, bool):
                raise SpecError(f"model.{key} must be true or false, got {value!r}")
            kw[key] = value
        else:
            if not isinstance(value, str):
                raise SpecError(f"model.{key} must be a string, got {value!r}")
            kw[key] = value
    kw.setdefault("name", "custom")
    kw.setdefault("n_kv_heads", kw["n_heads"])
    if "head_dim" not in kw:
        if kw["hidden_size"] % kw["n_heads"]:
            raise SpecError(
                f"model.head_dim is needed: hidden_size {kw['hidden_size']} is not a multiple "
                f"of n_heads {kw['n_heads']}"
            )
        kw["head_dim"] = kw["hidden_size"] // kw["n_heads"]
    return ModelArch(**kw)


# --------------------------------------------------------------------- Hugging Face configs
def _first(config: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = config.get(key)
        if value is not None:
            return value
    return None


def _need(config: Mapping[str, Any], model_type: str, *keys: str) -> Any:
    value = _first(config, *keys)
    if value is None:
        raise SpecError(
            f"Hugging Face config (model_type {model_type!r}) has no {keys[0]!r}"
            + (f" (nor {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else "")
            + "; pass explicit architecture numbers instead"
        )
    return value


# model_type → (tie default, norm, position, gated, attention_bias default, mlp_bias default)
_HF_DEFAULTS: dict[str, tuple[bool, str, str, bool, bool, bool]] = {
    "llama": (False, "rmsnorm", "rope", True, False, False),
    "mistral": (False, "rmsnorm", "rope", True, False, False),
    "qwen2": (False, "rmsnorm", "rope", True, True, False),
    "qwen3": (False, "rmsnorm", "rope", True, False, False),
    "qwen2_moe": (False, "rmsnorm", "rope", True, True, False),
    "qwen3_moe": (False, "rmsnorm", "rope", True, False, False),
    "mixtral": (False, "rmsnorm", "rope", True, False, False),
    "gemma": (True, "rmsnorm", "rope", True, False, False),
    "gemma2": (True, "rmsnorm", "rope", True, False, False),
    "phi3": (False, "rmsnorm", "rope", True, False, False),
    "gpt2": (True, "layernorm", "learned", False, True, True),
    "bert": (True, "layernorm", "learned", False, True, True),
    "mpt": (True, "layernorm", "alibi", False, False, False),
    "deepseek_v3": (False, "rmsnorm", "rope", True, False, False),
    "deepseek_v2": (False, "rmsnorm", "rope", True, False, False),
    "gpt_oss": (False, "rmsnorm", "rope", True, True, True),
}


def from_hf_config(config: Mapping[str, Any], name: str | None = None) -> ModelArch:
    """Map a Hugging Face ``config.json`` (already parsed) onto a :class:`ModelArch`.

    Known ``model_type`` values: llama, mistral, qwen2, qwen3, qwen2_moe, qwen3_moe, mixtral,
    gemma, gemma2, phi3, gpt2, bert, mpt, deepseek_v2, deepseek_v3, gpt_oss; anything else is read
    through the common keys (a llama-like decoder is assumed). A missing key raises SpecError.
    """
    if not isinstance(config, Mapping):
        raise SpecError(f"Hugging Face config must be an object, got {type(config).__name__}")
    cfg: dict[str, Any] = dict(config)
    if "text_config" in cfg and "num_hidden_layers" not in cfg:
        cfg = {**cfg, **cfg["text_config"]}  # multimodal wrappers keep the LM in text_config
    model_type = str(cfg.get("model_type") or "")
    tie_default, norm, position, gated, attn_bias, mlp_bias = _HF_DEFAULTS.get(
        model_type, (False, "rmsnorm", "rope", True, False, False)
    )
    arch_name = name or str(cfg.get("_name_or_path") or model_type or "custom")

    if model_type == "mpt":
        attn_cfg = cfg.get("attn_config") or {}
        hidden = _as_int("d_model", _need(cfg, model_type, "d_model"))
        n_heads = _as_int("n_heads", _need(cfg, model_type, "n_heads"))
        n_kv = _as_int("kv_n_heads", attn_cfg.get("kv_n_heads") or n_heads)
        ratio = _need(cfg, model_type, "expansion_ratio")
        ffn = cfg.get("ffn_config") or {}
        no_bias = bool(cfg.get("no_bias", True))
        return ModelArch(
            name=arch_name,
            n_layers=_as_int("n_layers", _need(cfg, model_type, "n_layers")),
            hidden_size=hidden,
            n_heads=n_heads,
            n_kv_heads=n_kv,
            head_dim=hidden // n_heads,
            intermediate_size=_as_int(
                "ffn_hidden_size", ffn.get("ffn_hidden_size") or int(ratio * hidden)
            ),
            vocab_size=_as_int("vocab_size", _need(cfg, model_type, "vocab_size")),
            tie_embeddings=not bool(cfg.get("no_tie", False)),
            gated_mlp=False,
            attention_bias=not no_bias,
            mlp_bias=not no_bias,
            norm="layernorm",
            position="alibi" if attn_cfg.get("alibi", True) else "learned",
            max_position_embeddings=_as_int("max_seq_len", cfg.get("max_seq_len") or 2048),
            family="mpt",
        )

    n_layers = _as_int(
        "num_hidden_layers", _need(cfg, model_type, "num_hidden_layers", "n_layer", "num_layers")
    )
    hidden = _as_int("hidden_size", _need(cfg, model_type, "hidden_size", "n_embd", "d_model"))
    n_heads = _as_int(
        "num_attention_heads", _need(cfg, model_type, "num_attention_heads", "n_head")
    )
    n_kv = _as_int(
        "num_key_value_heads",
        _first(cfg, "num_key_value_heads", "multi_query_group_num") or n_heads,
    )
    head_dim_raw = cfg.get("head_dim")
    head_dim = _as_int("head_dim", head_dim_raw) if head_dim_raw else hidden // n_heads
    if model_type == "gpt2":
        intermediate = _as_int("n_inner", cfg.get("n_inner") or 4 * hidden)
    else:
        intermediate = _as_int(
            "intermediate_size",
            _need(cfg, model_type, "intermediate_size", "ffn_dim", "n_inner"),
        )
    vocab = _as_int("vocab_size", _need(cfg, model_type, "vocab_size"))
    tie = cfg.get("tie_word_embeddings")
    tie = tie_default if tie is None else bool(tie)
    max_pos = _as_int(
        "max_position_embeddings",
        _first(cfg, "max_position_embeddings", "n_positions", "max_seq_len") or 4096,
    )
    attention_bias = cfg.get("attention_bias")
    attention_bias = attn_bias if attention_bias is None else bool(attention_bias)
    if model_type in ("qwen2", "qwen2_moe"):
        attention_bias = True  # q/k/v biases are hard-wired in Qwen2 attention
    mlp_b = cfg.get("mlp_bias")
    mlp_b = mlp_bias if mlp_b is None else bool(mlp_b)

    n_experts = _first(cfg, "num_local_experts", "num_experts", "n_routed_experts") or 1
    n_experts = _as_int("num_experts", n_experts)
    n_active = 1
    moe_width: int | None = None
    n_shared = 0
    n_dense = 0
    if n_experts > 1:
        n_active = _as_int(
            "num_experts_per_tok",
            _need(cfg, model_type, "num_experts_per_tok", "experts_per_token", "top_k"),
        )
        width = cfg.get("moe_intermediate_size")
        moe_width = _as_int("moe_intermediate_size", width) if width else None
        if moe_width == intermediate:
            moe_width = None
        n_shared = _as_int("n_shared_experts", cfg.get("n_shared_experts") or 0, minimum=0)
        shared_width = cfg.get("shared_expert_intermediate_size")
        if shared_width and not n_shared:
            base = moe_width or intermediate
            n_shared = max(1, round(int(shared_width) / base))  # Qwen2-MoE: one wide expert
        n_dense = _as_int("first_k_dense_replace", cfg.get("first_k_dense_replace") or 0, minimum=0)
        mlp_only = cfg.get("mlp_only_layers") or []
        if not n_dense and mlp_only:
            n_dense = len(mlp_only)

    kv_lora = cfg.get("kv_lora_rank")
    mla: dict[str, Any] = {}
    if kv_lora:
        mla = {
            "kv_lora_rank": _as_int("kv_lora_rank", kv_lora),
            "q_lora_rank": _as_int("q_lora_rank", cfg["q_lora_rank"])
            if cfg.get("q_lora_rank")
            else None,
            "qk_rope_head_dim": _as_int(
                "qk_rope_head_dim", _need(cfg, model_type, "qk_rope_head_dim")
            ),
            "qk_nope_head_dim": _as_int(
                "qk_nope_head_dim", _need(cfg, model_type, "qk_nope_head_dim")
            ),
            "v_head_dim": _as_int("v_head_dim", _need(cfg, model_type, "v_head_dim")),
        }
        head_dim = mla["qk_rope_head_dim"] + mla["qk_nope_head_dim"]
        n_kv = n_heads

    encoder_only = model_type in ("bert", "roberta")
    if encoder_only:
        tie = True
    family = model_type or "generic"
    return ModelArch(
        name=arch_name,
        n_layers=n_layers,
        hidden_size=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        tie_embeddings=tie,
        n_experts=n_experts,
        n_active_experts=n_active,
        gated_mlp=gated,
        moe_intermediate_size=moe_width,
        n_shared_experts=n_shared,
        n_dense_layers=n_dense,
        attention_bias=attention_bias,
        mlp_bias=mlp_b,
        norm=norm,
        position=position,
        max_position_embeddings=max_pos,
        encoder_only=encoder_only,
        family=family,
        **mla,
    )
