import json

import pytest

from predictor._paths import shared_dir
from predictor._published import _Skip, convert_published, convert_runtime_row, convert_vram_row
from predictor.measurements import parse_measurement

VALIDATION = shared_dir() / "validation"
needs_data = pytest.mark.skipif(not VALIDATION.exists(), reason="../shared/validation missing")


def _vram(**kw):
    row = {
        "id": "t1",
        "source": "src",
        "source_name": "name",
        "model": "Llama-2-7B",
        "params_b": 6.74,
        "arch": {},
        "workload": "lora",
        "framework": "torchtune (PyTorch)",
        "weight_dtype": "bf16",
        "compute_dtype": "bf16",
        "optimizer": "torch.optim.AdamW",
        "optimizer_state_dtype": None,
        "peft": "LoRA r=8 alpha=16 on q_proj,v_proj",
        "micro_batch_size": 2,
        "seq_len": 2048,
        "input_len": None,
        "output_len": None,
        "gradient_checkpointing": True,
        "kv_cache_dtype": None,
        "num_gpus": 8,
        "parallelism": "FSDP full shard",
        "gpu_model": "8 x A100 80GB",
        "peak_gib": 20.0,
        "measurement": "torch.cuda.max_memory_allocated()/1e9",
        "confidence": "high",
        "notes": None,
        "unit_basis": "GB(1e9)",
    }
    row.update(kw)
    return row


def test_vram_row_maps_fields_to_a_spec():
    m = parse_measurement(convert_vram_row(_vram()))
    s = m.spec
    assert s.lora_target is not None and s.framework is not None
    assert (s.task.value, s.lora_rank, s.lora_target.value) == ("lora", 8, "qv")
    assert (s.n_gpus, s.zero_stage, s.framework.value) == (8, 3, "torchtune")
    assert m.gpu == "A100-80GB" and m.measurement == "allocated" and m.peak_vram_gib == 20.0


def test_non_catalogue_gpu_keeps_raw_name_and_offload_is_skipped():
    m = parse_measurement(convert_vram_row(_vram(gpu_model="RTX 4090 24GB", num_gpus=1)))
    assert m.gpu is None and m.gpu_model == "RTX 4090 24GB"
    with pytest.raises(_Skip, match="offload"):
        convert_vram_row(_vram(parallelism="FSDP full shard + fsdp_cpu_offload=True"))


def test_training_throughput_becomes_step_time():
    row = {
        "id": "x",
        "source_id": "s",
        "source": "u",
        "reliability_tier": "A",
        "gpu": "H100 SXM 80GB",
        "num_gpus": 8,
        "tp": 1,
        "pp": 1,
        "workload": "pretraining",
        "model": "Llama 3 8B",
        "params_b": 8,
        "architecture": None,
        "precision": "BF16",
        "global_batch_size": 16,
        "micro_batch_size": 2,
        "seq_len": 4096,
        "metric": "tokens_per_sec_per_gpu",
        "value": 8192.0,
        "unit": "tokens/s/GPU",
        "framework": "torchtitan",
        "parallelism_notes": "FSDP",
    }
    m = parse_measurement(convert_runtime_row(row))
    assert m.step_time_s == pytest.approx(16 * 4096 / (8192.0 * 8))
    assert m.spec.tokens_per_step == 16 * 4096
    row2 = {**row, "workload": "inference_offline_max_throughput"}
    with pytest.raises(_Skip, match="offline"):
        convert_runtime_row(row2)


@needs_data
def test_every_validation_row_is_converted_or_skipped_with_a_reason():
    conv = convert_published(VALIDATION)
    total = sum(
        1
        for f in ("vram_measured.jsonl", "runtime_measured.jsonl")
        for line in (VALIDATION / f).read_text().splitlines()
        if line.strip()
    )
    assert len(conv.rows) + len(conv.skipped) == total
    assert all(s.reason for s in conv.skipped)
    ids = [r["id"] for r in conv.rows]
    assert len(ids) == len(set(ids))


@needs_data
def test_shipped_file_matches_a_fresh_conversion():
    from predictor._paths import datasets_dir

    shipped = (datasets_dir() / "measured" / "published.jsonl").read_text().splitlines()
    fresh = [json.dumps(r, sort_keys=True, ensure_ascii=False) for r in convert_published().rows]
    assert shipped == fresh


def test_torchtune_checkpointing_defaults_on_when_unstated():
    m = parse_measurement(convert_vram_row(_vram(gradient_checkpointing=None)))
    assert m.spec.gradient_checkpointing is True
    assert "torchtune configs default to True" in m.notes


def test_lit_gpt_lora_rows_accumulate_to_its_128_batch():
    """lit-gpt @8641822 finetune/lora.py: gradient_accumulation_iters = 128 // micro batch;
    the FSDP rows are no longer tagged as a quirk (the tracer models their no_sync gradients)."""
    from predictor.measurements import is_quirk

    fw = "lit-gpt @8641822 (Lightning Fabric)"
    row = _vram(framework=fw, num_gpus=2, micro_batch_size=4)
    m = parse_measurement(convert_vram_row(row))
    assert m.spec.gradient_accumulation == 32
    assert not is_quirk(m)
    assert parse_measurement(convert_vram_row(_vram())).spec.gradient_accumulation == 1


def test_torchtune_generate_at_its_preallocating_commit_states_its_kv_cache():
    from predictor._published_vram import PREALLOCATED_KV_NOTE
    from predictor.measurements import calibration_exclusion

    gen = {
        "workload": "inference-decode",
        "model": "Llama-3-8B",
        "micro_batch_size": 1,
        "input_len": 6,
        "output_len": 206,
        "num_gpus": 1,
        "parallelism": "single device",
        "peft": None,
        "seq_len": None,
    }
    row = _vram(**gen, source="github:pytorch/torchtune recipes/generate.py @20747cd87 line 140")
    m = parse_measurement(convert_vram_row(row))
    assert PREALLOCATED_KV_NOTE in m.notes
    assert (m.spec.kv_cache_max_len, m.spec.kv_cache_query_heads) == (4096, True)
    # the spec now says the program's cache: an ordinary row, not a quirk
    assert calibration_exclusion(m) is None
    # another torchtune generate run (a later recipe sizes the cache to prompt + new tokens)
    later = parse_measurement(convert_vram_row(_vram(**gen, source="torchtune @v0.4.0")))
    assert calibration_exclusion(later) is None
    assert later.spec.kv_cache_max_len is None


def test_static_batch_throughput_gives_runtime_not_a_prefill_polluted_tpot():
    row = {
        "id": "x",
        "source": "s",
        "gpu": "H100 SXM 80GB",
        "num_gpus": 1,
        "tp": 1,
        "model": "Llama-2-7B",
        "params_b": 6.74,
        "architecture": None,
        "precision": "FP16",
        "workload": "inference_static_batch_throughput",
        "global_batch_size": 64,
        "input_len": 128,
        "output_len": 128,
        "metric": "output_tokens_per_sec",
        "value": 8000.0,
        "unit": "output tokens/s",
        "framework": "TensorRT-LLM",
    }
    m = parse_measurement(convert_runtime_row(row))
    assert m.runtime_s == pytest.approx(64 * 128 / 8000.0) and m.tpot_s is None
    with_ttft = parse_measurement(convert_runtime_row({**row, "other_metrics": {"ttft_ms": 100}}))
    assert with_ttft.tpot_s == pytest.approx((64 * 128 / 8000.0 - 0.1) / 127)


def test_stated_compile_chunked_loss_and_offload_reach_the_spec():
    base = {
        "num_gpus": 1,
        "parallelism": "single device",
        "workload": "full-finetune",
        "peft": None,
        "gpu_model": "A100 80GB",
    }

    def spec(notes, **kw):
        return convert_vram_row(_vram(**{**base, **kw}, notes=notes))["spec"]

    eager = spec("Cumulative settings: no compile; standard cross-entropy.")
    assert "compile" not in eager and eager["chunked_loss"] is False
    compiled = spec(
        "Cumulative settings: no compile; standard cross-entropy; "
        "+ torch.compile; + CEWithChunkedOutputLoss."
    )
    assert compiled["compile"] is True and compiled["chunked_loss"] is True
    offload = spec(
        "LoRA row uses packed 4096, compile, chunked CE, activation "
        "checkpointing and activation offloading.",
        workload="lora",
        peft="LoRA r=8 on q_proj,v_proj",
    )
    assert offload["activation_offload"] is True and offload["compile"] is True
    on = convert_vram_row(_vram(framework="torchtune (PyTorch, torch.compile on)"))["spec"]
    assert on["compile"] is True


def test_litgpt_bf16_true_lora_keeps_bf16_adapters_and_nvml_rows_their_context():
    lit = convert_vram_row(
        _vram(
            framework="lit-gpt (Lightning Fabric)",
            num_gpus=1,
            parallelism="single device",
            notes="--precision bf16-true: weights, LoRA params and optimizer states all bf16.",
        )
    )
    assert lit["spec"]["adapter_dtype"] == "bf16"
    fp32 = convert_vram_row(
        _vram(
            framework="lit-gpt (Lightning Fabric)",
            num_gpus=1,
            weight_dtype="fp32",
            parallelism="single device",
            notes="Compare the bf16-true row.",
        )
    )
    assert "adapter_dtype" not in fp32["spec"]
    smi = convert_vram_row(
        _vram(
            framework="HF transformers Trainer",
            num_gpus=1,
            parallelism="single device",
            measurement="pynvml used after training (includes ~1343 MiB CUDA context)",
        )
    )
    assert smi["measurement"] == "nvml_used"
    assert smi["hardware"]["cuda_context_gib"] == pytest.approx(1343 / 1024, abs=1e-3)


@needs_data
def test_source_stated_engine_stack_and_power_cap_reach_the_rows():
    from predictor.measurements import calibration_exclusion, is_quirk

    rows = {
        r["id"]: json.loads(line)
        for line in (VALIDATION / "runtime_measured.jsonl").read_text().splitlines()
        if line.strip()
        for r in [json.loads(line)]
    }
    # The InferenceX issue sweeps vLLM; its stored excerpt does not say so.
    m = parse_measurement(convert_runtime_row(rows["inferencex_issues-0008"]))
    assert m.spec.framework is not None and m.spec.framework.value == "vllm"
    assert "gptoss h100 vllm" in m.notes
    # NeMo AutoModel is the PyTorch/FSDP2 stack, not Megatron-Core.
    m = parse_measurement(convert_runtime_row(rows["nemo_automodel_perf_summary-0011"]))
    assert m.spec.framework is not None and m.spec.framework.value == "fsdp"
    # "power limited" B200s at an unstated cap: kept, never calibrate.
    m = parse_measurement(convert_runtime_row(rows["torchao_mx_b200-0002"]))
    assert is_quirk(m) and calibration_exclusion(m) is not None
    assert "[quirk:power-cap]" in m.notes


def test_source_programs_reach_the_spec() -> None:
    """What each source's code ran: LitGPT's LoRA dropout, llama-recipes' eager attention and
    fp32 adapters, bitsandbytes nf4 with or without double quantisation, and LitGPT
    pretrain's gradient accumulation (global batch 512 by default)."""
    lit = convert_vram_row(_vram(framework="lit-gpt (Lightning Fabric)", num_gpus=1))["spec"]
    assert lit["lora_dropout"] == 0.05
    recipes = convert_vram_row(
        _vram(
            framework="llama-recipes", source="https://github.com/meta-llama/llama-cookbook/pull/41"
        )
    )["spec"]
    assert (recipes["attn_implementation"], recipes["adapter_dtype"]) == ("eager", "fp32")
    # HF's v4.2x single-GPU docs ran the Trainer on torch < 2.0: gradients zeroed, not freed.
    docs = "github:huggingface/transformers docs/source/en/perf_train_gpu_one.mdx @0016acf7"
    bert = convert_vram_row(_vram(framework="HF transformers Trainer", source=docs))["spec"]
    assert bert["zero_grad_set_to_none"] is False
    assert (bert["torch_version"], bert["head"]) == ("1.10", "classification")
    assert "zero_grad_set_to_none" not in lit
    nf4 = {"workload": "qlora", "num_gpus": 1, "parallelism": "single device"}
    plain = convert_vram_row(_vram(weight_dtype="NF4 (bitsandbytes) base", **nf4))["spec"]
    dq = convert_vram_row(_vram(weight_dtype="NF4 (bitsandbytes, double-quant)", **nf4))["spec"]
    assert (plain["double_quant"], dq["double_quant"]) == (False, True)
    pre = {"workload": "pretraining", "peft": None, "framework": "litgpt pretrain (Fabric)"}
    one = convert_vram_row(_vram(num_gpus=1, micro_batch_size=4, **pre))["spec"]
    eight = convert_vram_row(
        _vram(num_gpus=8, micro_batch_size=4, notes="--train.global_batch_size 32.", **pre)
    )["spec"]
    assert (one["gradient_accumulation"], eight["gradient_accumulation"]) == (128, 1)


def test_torchtune_rows_before_chunked_cross_entropy_are_not_chunked():
    """CEWithChunkedOutputLoss came to torchtune in 4fba6cd44 (2024-08-28); the configs at
    @0217d44c2 name torch.nn.CrossEntropyLoss on the whole logits."""
    old = parse_measurement(convert_vram_row(_vram(source="github:pytorch/torchtune @0217d44c2")))
    assert old.spec.chunked_loss is False
    assert "CEWithChunkedOutputLoss" in old.notes
    new = parse_measurement(convert_vram_row(_vram(source="github:pytorch/torchtune @1814feb17")))
    assert new.spec.chunked_loss is True  # torchtune's default since
