from __future__ import annotations

import json
from pathlib import Path

import pytest

from predictor.exceptions import SpecError, UnknownModelError
from predictor.spec import DType, JobSpec, LoraTarget, Optimizer, Task, load_specs, parse_spec
from tests.jobs import TINY_LLAMA

INFER = {"model": "llama-3.1-8b", "task": "inference"}
TRAIN = {"model": "llama-3.1-8b", "task": "full_finetune"}


def test_contract_example_fields_parse_per_task() -> None:
    spec = parse_spec(
        {
            "id": "a",
            "model": "llama-3.1-8b",
            "task": "inference",
            "framework": "hf",
            "weight_dtype": "bf16",
            "kv_cache_dtype": "bf16",
            "compute_dtype": "bf16",
            "batch_size": 8,
            "input_len": 1024,
            "output_len": 256,
            "num_requests": 1000,
            "n_gpus": 1,
            "tensor_parallel": 1,
            "pipeline_parallel": 1,
            "gpu": None,
            "command": ["python", "serve.py"],
            "priority": 0,
            "deadline_s": None,
        }
    )
    assert spec.task is Task.INFERENCE and spec.num_requests == 1000


def test_defaults_are_filled_for_applicable_fields_only() -> None:
    t = parse_spec(TRAIN)
    assert t.seq_len == 2048 and t.optimizer is Optimizer.ADAMW and t.steps == 1000
    assert t.input_len is None and t.lora_rank is None
    i = parse_spec(INFER)
    assert i.input_len == 512 and i.num_requests == i.batch_size and i.seq_len is None
    q = parse_spec({**TRAIN, "task": "qlora"})
    assert q.weight_dtype is DType.NF4 and q.compute_dtype is DType.BF16
    assert q.lora_rank == 16 and q.lora_target is LoraTarget.ALL_LINEAR


def test_dump_round_trips() -> None:
    s = parse_spec({**TRAIN, "task": "lora", "lora_rank": 8, "id": "x"})
    assert parse_spec(json.loads(json.dumps(s.to_dict()))) == s


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({**TRAIN, "lora_rnk": 8}, "unknown field `lora_rnk`"),
        ({**TRAIN, "lora_rnk": 8}, "did you mean `lora_rank`"),
        ({**INFER, "lora_rank": 8}, "`lora_rank` does not apply to `inference` jobs"),
        ({**TRAIN, "output_len": 8}, "`output_len` does not apply"),
        ({**INFER, "seq_len": 8}, "input_len"),
        (
            {**TRAIN, "n_gpus": 8, "tensor_parallel": 3},
            "`tensor_parallel` must divide `n_gpus`; got 3 and 8",
        ),
        ({**TRAIN, "batch_size": 0}, "batch_size"),
        ({**TRAIN, "gpu": "H100"}, "did you mean 'H100-80GB'"),
        ({**TRAIN, "command": "python train.py"}, "argv list"),
        ({**TRAIN, "task": "qlora", "weight_dtype": "bf16"}, "4-bit base"),
        ({**TRAIN, "task": "train"}, "task"),
    ],
)
def test_invalid_specs_give_one_clear_message(data: dict, needle: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    assert needle in str(err.value)


def test_unknown_model_is_rejected_with_suggestion() -> None:
    with pytest.raises(UnknownModelError, match="did you mean 'llama-3-8b'"):
        parse_spec({**TRAIN, "model": "lama-3-8b"})


def test_explicit_architecture_object() -> None:
    # The tiny llama's sizes, with every other key an explicit object may carry.
    extra = {"tie_embeddings": True, "n_experts": 1, "n_active_experts": 1, "params_b": None}
    arch = {**TINY_LLAMA, "name": "tiny", **extra}
    spec = parse_spec({**TRAIN, "model": arch})
    assert spec.arch.n_layers == 2 and spec.model_name == "tiny"


def test_hf_config_path(tmp_path: Path) -> None:
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 512,
        "vocab_size": 3200,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = parse_spec({**TRAIN, "model": str(tmp_path / "config.json")})
    assert spec.arch.n_kv_heads == 2


def test_load_jsonl_json_yaml(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(json.dumps(INFER) + "\n\n" + json.dumps(TRAIN) + "\n")
    (tmp_path / "b.json").write_text(json.dumps([INFER, TRAIN]))
    (tmp_path / "c.yaml").write_text(
        "model: llama-3.1-8b\ntask: inference\n---\nmodel: gpt2\ntask: pretrain\n"
    )
    for name in ("a.jsonl", "b.json", "c.yaml"):
        specs = load_specs(tmp_path / name)
        assert len(specs) == 2 and all(isinstance(s, JobSpec) for s in specs)


def test_load_reports_the_bad_line(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(
        json.dumps(INFER) + "\n" + json.dumps({**INFER, "steps": 3}) + "\n"
    )
    with pytest.raises(SpecError, match=r"a\.jsonl:2: `steps` does not apply"):
        load_specs(tmp_path / "a.jsonl")


def test_memory_fidelity_fields_and_framework_defaults() -> None:
    from predictor.spec import parse_spec

    q = parse_spec({"model": "llama-3.1-8b", "task": "qlora"})
    assert q.gradient_checkpointing is True  # as peft's prepare_model_for_kbit_training does
    assert (
        parse_spec(
            {"model": "llama-3.1-8b", "task": "qlora", "gradient_checkpointing": False}
        ).gradient_checkpointing
        is False
    )
    tt = parse_spec({"model": "llama-3.1-8b", "task": "lora", "framework": "torchtune"})
    assert (tt.compile, tt.chunked_loss, tt.adapter_dtype.value) == (False, True, "bf16")
    hf = parse_spec({"model": "llama-3.1-8b", "task": "lora"})
    assert (hf.chunked_loss, hf.adapter_dtype.value) == (False, "fp32")
    for bad in (
        {"task": "inference", "chunked_loss": True},
        {"task": "full_finetune", "adapter_dtype": "bf16"},
    ):
        with pytest.raises(SpecError, match="does not apply"):
            parse_spec({"model": "llama-3.1-8b", **bad})
    with pytest.raises(SpecError, match="adapter_dtype"):
        parse_spec({"model": "llama-3.1-8b", "task": "lora", "adapter_dtype": "int8"})


def test_lora_dropout_and_attention_kernel_fields() -> None:
    from predictor.spec import parse_spec

    s = parse_spec(
        {
            "model": "llama-3.1-8b",
            "task": "lora",
            "lora_dropout": 0.05,
            "attn_implementation": "eager",
        }
    )
    assert (s.lora_dropout, s.attn_implementation.value) == (0.05, "eager")
    assert parse_spec({"model": "llama-3.1-8b", "task": "lora"}).lora_dropout is None  # = 0
    with pytest.raises(SpecError, match="does not apply"):
        parse_spec({"model": "llama-3.1-8b", "task": "full_finetune", "lora_dropout": 0.1})
    for bad in ({"lora_dropout": 1.0}, {"lora_dropout": -0.1}, {"attn_implementation": "xformers"}):
        with pytest.raises(SpecError):
            parse_spec({"model": "llama-3.1-8b", "task": "lora", **bad})


def test_zero_grad_set_to_none_applies_to_training_only() -> None:
    from predictor.spec import parse_spec

    job = {"model": "llama-3.1-8b", "task": "full_finetune"}
    assert parse_spec(job).zero_grad_set_to_none is None  # = true, torch >= 2.0's default
    assert parse_spec({**job, "zero_grad_set_to_none": False}).zero_grad_set_to_none is False
    lora = parse_spec({**job, "task": "lora", "zero_grad_set_to_none": False})
    assert lora.zero_grad_set_to_none is False
    with pytest.raises(SpecError, match="does not apply"):
        parse_spec({**job, "task": "inference", "zero_grad_set_to_none": False})


def test_head_and_torch_version_fields() -> None:
    from predictor._spec_rules import saves_softmax_input
    from predictor.spec import parse_spec

    job = {"model": "bert-large", "task": "full_finetune"}
    s = parse_spec({**job, "head": "classification", "torch_version": "1.10"})
    assert (s.head.value, saves_softmax_input(s)) == ("classification", True)
    assert not saves_softmax_input(parse_spec({**job, "torch_version": "2.1.0"}))
    assert not saves_softmax_input(parse_spec(job))  # unset: a current torch
    for bad in ({"torch_version": "1.x"}, {"torch_version": "1"}, {"head": "token"}):
        with pytest.raises(SpecError):
            parse_spec({**job, **bad})
    with pytest.raises(SpecError, match="does not apply"):
        parse_spec({"model": "bert-large", "task": "inference", "head": "classification"})


def test_double_quant_applies_to_nf4_and_follows_the_framework() -> None:
    from predictor._jobarrays import NF4_SINGLE_QUANT_BYTES, weight_qbytes
    from predictor.spec import parse_spec

    q = {"model": "llama-3.1-8b", "task": "qlora"}
    hf, tt = parse_spec(q), parse_spec({**q, "framework": "torchtune"})
    assert (hf.double_quant, tt.double_quant) == (False, True)  # bitsandbytes vs torchao
    assert weight_qbytes(hf) == NF4_SINGLE_QUANT_BYTES == 0.5 + 4 / 64
    assert weight_qbytes(tt) == pytest.approx(0.5 + 1 / 64 + 4 / (64 * 256))
    assert parse_spec({**q, "double_quant": True}).double_quant is True
    assert parse_spec({"model": "llama-3.1-8b", "task": "lora"}).double_quant is None
    with pytest.raises(SpecError, match="double_quant"):
        parse_spec({"model": "llama-3.1-8b", "task": "lora", "double_quant": True})


def test_preallocated_kv_cache_fields() -> None:
    from predictor.spec import parse_spec

    job = {"model": "llama-3-8b", "task": "inference", "input_len": 6, "output_len": 206}
    s = parse_spec({**job, "kv_cache_max_len": 4096, "kv_cache_query_heads": True})
    assert (s.kv_cache_max_len, s.kv_cache_query_heads) == (4096, True)
    assert parse_spec(job).kv_cache_max_len is None  # unset: a cache that grows
    with pytest.raises(SpecError, match=r"`kv_cache_max_len` 100 is below .* = 212.*at least 212"):
        parse_spec({**job, "kv_cache_max_len": 100})
    with pytest.raises(SpecError, match="kv_cache_max_len"):
        parse_spec({**job, "kv_cache_max_len": 0})
    train = {"model": "llama-3-8b", "task": "full_finetune", "kv_cache_max_len": 4096}
    with pytest.raises(SpecError, match="`kv_cache_max_len` does not apply to `full_finetune`"):
        parse_spec(train)
    serve = {"model": "llama-3-8b", "task": "serve", "kv_cache_query_heads": True}
    with pytest.raises(SpecError, match="`kv_cache_query_heads` does not apply to `serve`"):
        parse_spec({**serve, "request_rate": 1.0, "duration_s": 60})


def test_transformers_version_field() -> None:
    from predictor._spec_rules import shifts_fp32_logits
    from predictor.spec import parse_spec

    job = {"model": "llama-2-7b", "task": "lora"}
    assert shifts_fp32_logits(parse_spec({**job, "transformers_version": "4.31"}))
    assert shifts_fp32_logits(parse_spec({**job, "transformers_version": "4.48.0"}))
    assert not shifts_fp32_logits(parse_spec({**job, "transformers_version": "4.50.0"}))
    assert not shifts_fp32_logits(parse_spec(job))  # unset: a current transformers
    with pytest.raises(SpecError, match="transformers_version"):
        parse_spec({**job, "transformers_version": "four"})
    with pytest.raises(SpecError, match="`transformers_version` does not apply to `inference`"):
        parse_spec({"model": "llama-2-7b", "task": "inference", "transformers_version": "4.31"})


def test_use_cache_applies_to_training_only() -> None:
    from predictor.spec import parse_spec

    assert parse_spec({"model": "llama-2-7b", "task": "lora", "use_cache": True}).use_cache
    with pytest.raises(SpecError, match="`use_cache` does not apply to `inference`"):
        parse_spec({"model": "llama-2-7b", "task": "inference", "use_cache": True})
