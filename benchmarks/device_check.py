"""One prepared accelerator check: the lean forward, the sampler and a GRPO run in bf16. Imports no Django.

Made to be the single command of a device session (budgets there are minutes), and runnable on
the CPU first so that no device time is spent finding its bugs:

    PYTHONUNBUFFERED=1 python3 benchmarks/device_check.py --device cuda --json $OUT/device_check.json
    .venv/bin/python benchmarks/device_check.py --device cpu      # the same checks, here

It needs torch, transformers, peft, tokenizers and safetensors (the GPU image has them) and the
repository; it builds the tiny model itself. Checks, in order:
  1. lean vs transformers log-probs for the activation dtype the trainer picks on the device
     (bf16 on CUDA) with fp32 LoRA tensors, with and without prompt sharing; LoRA gradient
     agreement (cosine similarity);
  2. the sampler: grpo_step's round (16 completions x 32 tokens), tokens/s, and its behaviour
     log-probs against a transformers forward of the sampled sequences;
  3. a GRPO run (`train_grpo`, device auto) over groups the sampler produced: phase timings,
     forward path, fallbacks, peak memory;
  4. the training memory preflight's estimate (core.contracts.training_memory) against the memory
     one policy forward and backward really takes on a random Qwen3 of hidden 1024 and a 151,936
     vocabulary (on CUDA: the allocator's peak above what was allocated before; printed, not asserted).
Exit status 1 when an equality check misses its tolerance; speed is printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import grpo_step  # noqa: E402 - the same round of completions as the TRL benchmark

# Tolerances on log-probs (nats): fp32 agrees to rounding; bf16 activations round at ~3 digits.
TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 5e-2, torch.float16: 5e-2}
MIN_GRAD_COSINE = 0.99


def check_lean_forward(model_dir: Path, device: torch.device, dtype: torch.dtype) -> dict:
    from transformers import AutoModelForCausalLM

    from gpu_runtime import lean_decoder
    from gpu_runtime.grpo.adapter_io import attach_lora
    from gpu_runtime.grpo.reference import token_logprobs

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    peft = attach_lora(model.to(device).eval(), rank=8, alpha=16)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    params = [p for _, p in sorted(peft.named_parameters()) if p.requires_grad]
    ids = torch.randint(5, 1000, (8, 64), device=device)
    ids[:, :24] = ids[0, :24]  # a shared 24-token prompt
    start = 24

    def run(compute):
        for p in params:
            p.grad = None
        values = compute()[:, start:]
        values.float().sum().backward()
        return values.detach().float(), torch.cat([p.grad.flatten().float() for p in params])

    hf, hf_grad = run(lambda: token_logprobs(peft(input_ids=ids).logits, ids))
    plan = lean_decoder.plan_for(peft)
    out = {"dtype": str(dtype).removeprefix("torch."), "tolerance": TOLERANCE[dtype]}
    for label, prefix in (("full", 0), ("shared_prompt", start)):
        values, grad = run(lambda p=prefix: lean_decoder.sequence_logprobs(plan, ids, start, prefix=p))
        cosine = float(torch.nn.functional.cosine_similarity(grad, hf_grad, dim=0))
        out[label] = {"max_abs_logprob_diff": float((values - hf).abs().max()), "grad_cosine": cosine}
    out["ok"] = all(
        out[k]["max_abs_logprob_diff"] <= TOLERANCE[dtype] and out[k]["grad_cosine"] >= MIN_GRAD_COSINE
        for k in ("full", "shared_prompt")
    )
    return out


def check_sampler(model_dir: Path, device: torch.device, dtype: torch.dtype) -> tuple[dict, list[dict]]:
    """grpo_step's round (2 prompts x 8 x 32 tokens) on the device, timed, log-probs checked."""
    from gpu_runtime.model_loading import load_model
    from gpu_runtime.sampler import Sampler

    loaded = load_model(model_dir, device=device, dtype=dtype)
    sampler = Sampler(loaded)
    grpo_step.sample_round(sampler, seed=999)  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    results, generation_ms = grpo_step.sample_round(sampler, seed=0)
    worst = 0.0
    with torch.inference_mode():
        for result in results[:4]:
            ids = result.prompt_token_ids + result.completion_token_ids
            logits = loaded.model(input_ids=torch.tensor([ids], device=device)).logits[0].float()
            logprobs = torch.log_softmax(logits, -1)
            first = len(result.prompt_token_ids) - 1
            for i, token in enumerate(result.completion_token_ids):
                worst = max(worst, abs(float(logprobs[first + i, token]) - result.token_logprobs[i]))
    tokens = sum(len(r.completion_token_ids) for r in results)
    summary = {
        "forward_path": sampler.forward_path,
        "tokens": tokens,
        "seconds": round(generation_ms / 1000, 4),
        "tokens_per_second": round(tokens / (generation_ms / 1000), 1),
        "max_abs_behavior_logprob_diff": worst,
        "tolerance": TOLERANCE[dtype],
        "ok": worst <= TOLERANCE[dtype],
    }
    return summary, grpo_step.scored_groups(results)


def check_training(model_dir: Path, device_name: str, groups: list[dict]) -> dict:
    from core.contracts.grpo_config import GrpoConfig
    from gpu_runtime.grpo.trainer import TrainRequest, train_grpo

    config = GrpoConfig.from_dict(
        {
            "optimizer": {"kind": "adam_w"},
            "learning_rate": 1e-5,
            "kl_coeff": 0.1,
            "dynamic_sampling": False,
            "behavior_policy": "recorded",
            "seed": 0,
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        if device_name.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        result = train_grpo(
            TrainRequest(
                model_dir=model_dir,
                groups=groups * 4,  # 8 optimizer groups
                config=config,
                output_dir=Path(tmp) / "device-check",
                adapter_name="device-check",
                device=device_name,
                template_kwargs={"enable_thinking": False},
            ),
            on_progress=lambda figures: None,
            should_stop=lambda: False,
        )
        wall = time.perf_counter() - started
    receipt = result.receipt
    losses = [step["loss"] for step in receipt["loss_history"]]
    return {
        "wall_seconds": round(wall, 3),
        "optimizer_steps": result.final_step,
        "execution_provenance": receipt["runtime"]["execution_provenance"],
        "training_precision": receipt["runtime"]["training_precision"],
        "peak_vram_mib": receipt["runtime"].get("peak_vram_mib"),
        "fallbacks": receipt["fallbacks"],
        "phase_timings": receipt["phase_timings"],
        "losses_finite": all(v == v and abs(v) != float("inf") for v in losses),
        "ok": all(v == v and abs(v) != float("inf") for v in losses),
    }


def check_memory_estimate(device: torch.device, dtype: torch.dtype) -> dict:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from core.contracts.training_memory import GroupTokens, ModelShape, estimate_step
    from gpu_runtime import lean_decoder
    from gpu_runtime.grpo.adapter_io import attach_lora
    from gpu_runtime.kernels import selection

    shape = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=4, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=64, vocab_size=151936, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**shape, max_position_embeddings=4096)).to(device=device, dtype=dtype)
    model = attach_lora(model, rank=16, alpha=32)
    for _, param in model.named_parameters():
        if param.requires_grad:
            param.data = param.data.float()
    plan = lean_decoder.plan_for(model)
    kernels = selection.choose(device)
    head = None
    if kernels.triton:
        from gpu_runtime.kernels.lm_head import fused_lm_logprobs

        head = fused_lm_logprobs
    rows = []
    # On the CPU (a dry run of this script) one small group: the large ones take minutes and ~12 GB there.
    groups = ((64, 256, 8), (128, 512, 16)) if device.type == "cuda" else ((32, 64, 4),)
    for prompt, completion, count in groups:
        ids = torch.randint(5, 1000, (count, prompt + completion), device=device)
        ids[:, :prompt] = ids[0, :prompt]
        estimate = estimate_step(ModelShape.from_config(shape), GroupTokens(prompt, (completion,) * count),
                                 lora_rank=16, device=device.type, fused_head=head is not None)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        logprobs = lean_decoder.sequence_logprobs(plan, ids, prompt, prefix=prompt, head=head)
        logprobs.sum().backward()
        measured = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            measured = (torch.cuda.max_memory_allocated(device) - before) / 2**20
        model.zero_grad(set_to_none=True)
        # The estimate's adapter part holds the optimizer's moments too, which one backward does not make.
        without_optimizer = (estimate.total_bytes - estimate.adapter_bytes // 2) / 2**20
        rows.append({"group": f"{prompt} + {count} x {completion}", "estimate_mib": round(without_optimizer, 1),
                     "measured_peak_mib": None if measured is None else round(measured, 1),
                     "ratio": None if measured is None else round(without_optimizer / measured, 3)})
    return {"kernels": kernels.to_record(), "rows": rows, "ok": True}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model-dir", type=Path, help="a local model dir (default: build the tiny model)")
    parser.add_argument("--warm-steps", type=int, default=30)
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16"], help="checks 1-2 (default: what the trainer picks)"
    )
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)

    from gpu_runtime.grpo.run_support import resolve_device

    device, dtype = resolve_device(args.device, [])
    if args.dtype:
        dtype = getattr(torch, args.dtype)
    report: dict = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            model_dir = grpo_step.build_tiny_model(Path(tmp), args.warm_steps)
        print("1. lean forward vs transformers...", flush=True)
        report["lean_forward"] = check_lean_forward(model_dir, device, dtype)
        print("2. sampler...", flush=True)
        report["sampler"], groups = check_sampler(model_dir, device, dtype)
        print("3. GRPO training...", flush=True)
        report["training"] = check_training(model_dir, args.device, groups)
        print("4. training memory estimate...", flush=True)
        report["memory_estimate"] = check_memory_estimate(device, dtype)
    report["ok"] = all(report[k]["ok"] for k in ("lean_forward", "sampler", "training"))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
