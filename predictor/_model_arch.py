"""The architecture dataclass: a transformer's shape and the exact counts derived from it.

:class:`ModelArch` holds layers, widths, heads, experts and MLA ranks, and derives parameter
counts, KV-cache size and the list of linear layers with exact integer arithmetic. Where the
numbers come from (catalogue, ``config.json``, explicit objects) is :mod:`predictor.models`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from predictor.exceptions import SpecError

__all__ = ["EXPLICIT_KEYS", "LORA_TARGETS", "ModelArch"]

# The transformer's shape: integer fields every architecture gives.
_SHAPE_FIELDS: tuple[str, ...] = (
    "n_layers",
    "hidden_size",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
)

#: Keys of the explicit-architecture object in the JobSpec contract (DESIGN.md).
EXPLICIT_KEYS: tuple[str, ...] = (
    "name",
    *_SHAPE_FIELDS,
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
    *_SHAPE_FIELDS,
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
_INT_FIELDS = frozenset(
    _POSITIVE_INT_FIELDS + _OPTIONAL_POSITIVE_INT_FIELDS + _NON_NEGATIVE_INT_FIELDS
)
