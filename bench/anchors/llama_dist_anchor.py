#!/usr/bin/env python3
"""The Llama anchors of scripts/device/llama8b_2gpu.sh: transformers' LlamaForCausalLM (sdpa
attention, random weights) trained on several GPUs (torchrun) the way users of each framework
run it, next to `zerotrain train --model llama3-8b` at ZeRO-3:

  fsdp2      torch FSDP2 (fully_shard per decoder layer and the root), fp32 parameters with
             MixedPrecisionPolicy(param bf16, reduce fp32), fused AdamW; built on the meta
             device and materialized sharded (no rank holds the whole model)
  deepspeed  DeepSpeed ZeRO-3, bf16 (bf16 parameters, fp32 master), its FusedAdam; the model
             built under deepspeed.zero.Init (partitioned as it is built)
  --lora R   (deepspeed only) peft LoRA of rank R on every linear of the decoder (q/k/v/o,
             gate/up/down), the base frozen and partitioned by ZeRO-3 -- Hugging Face's
             documented way to LoRA-fine-tune with ZeRO-3
  --qlora    with --lora: the base linears as bitsandbytes NF4 (Linear4bit, blocksize 64,
             double quantization, quant_storage bf16 so ZeRO-3 can partition them), as
             Hugging Face documents QLoRA with ZeRO-3; needs the bitsandbytes package

Activation checkpointing (non-reentrant, per decoder layer) with --checkpoint-activations.
Random token batches (as zerotrain's --data random), loss = the model's own causal-LM loss.
Rank 0 prints one JSON line: ms/iter (median of the timed steps), per-phase ms (forward,
backward, step; host clock at synchronized phase boundaries) and peak GiB, tokens/s of the
whole job, FLOPs per token (zerotrain's 6(N+Vd)+12LdT, model FLOPs without recompute) and MFU
at --peak-tflops per GPU.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

PHASES = ("forward", "backward", "step")


def llama_config(name, layers):
    from transformers import LlamaConfig
    shapes = {
        # meta-llama/Meta-Llama-3-8B config.json
        "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=8192,
                          rope_theta=500000.0, tie_word_embeddings=False),
        # meta-llama/Llama-3.2-1B
        "llama3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                            max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
                            rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    }
    kw = dict(shapes[name])
    if layers:
        kw["num_hidden_layers"] = layers
    return LlamaConfig(rms_norm_eps=1e-5, attn_implementation="sdpa", **kw)


def flops_per_token(cfg, n_params, seq):
    """zerotrain's llama_flops_per_token: 6(N_layers + V d) + 12 L q_dim T."""
    vd = cfg.vocab_size * cfg.hidden_size
    tables = (1 if cfg.tie_word_embeddings else 2) * vd
    q_dim = cfg.num_attention_heads * cfg.head_dim
    return 6.0 * (n_params - tables + vd) + 12.0 * cfg.num_hidden_layers * q_dim * seq


def n_params_of(cfg):
    d, f, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    layer = d * q + 2 * d * kv + q * d + 3 * d * f + 2 * d
    return L * layer + d + V * d * (1 if cfg.tie_word_embeddings else 2)


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_fsdp2(cfg, args, device):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    if args.checkpoint_activations:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    model.to_empty(device=device)
    torch.manual_seed(args.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if "norm" in name:
                local.fill_(1.0)
            else:
                local.normal_(0.0, 0.02)
    model.model.rotary_emb = LlamaRotaryEmbedding(cfg, device=device)  # its buffers were on meta
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            fused=True)
    notes = {"precision": "fp32 params, MixedPrecisionPolicy(param bf16, reduce fp32)",
             "optimizer": "torch AdamW(fused=True)", "wrap": "fully_shard per decoder layer + root"}

    def step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, model, step, notes


def deepspeed_config(args):
    return {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 1 << 30,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8,
                                                   "weight_decay": 0.0}},
        "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                              "stage3_gather_16bit_weights_on_model_save": False},
        "wall_clock_breakdown": False,
    }


def build_deepspeed(cfg, args, device):
    # DeepSpeed's op builder parses TORCH_CUDA_ARCH_LIST as numbers ("9.0a" fails): build its
    # JIT ops (FusedAdam) for this device's capability.
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if arch is not None and any(c.isalpha() for c in arch.replace("PTX", "")):
        cap = torch.cuda.get_device_capability(device)
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{cap[0]}.{cap[1]}"
    import deepspeed
    from transformers import LlamaForCausalLM
    ds_cfg = deepspeed_config(args)
    torch.manual_seed(args.seed)
    notes = {"deepspeed": deepspeed.__version__, "config": ds_cfg}
    if args.qlora:
        model = build_qlora_base(cfg, args, device, notes)
    else:
        with deepspeed.zero.Init(config_dict_or_path=ds_cfg, dtype=torch.bfloat16):
            model = LlamaForCausalLM(cfg)
    if args.checkpoint_activations:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.lora:
        from peft import LoraConfig, get_peft_model
        lc = LoraConfig(r=args.lora, lora_alpha=2 * args.lora, lora_dropout=0.0, target_modules=LORA_TARGETS,
                        task_type="CAUSAL_LM")
        model = get_peft_model(model, lc)
        notes["peft"] = {"r": args.lora, "alpha": 2 * args.lora, "targets": LORA_TARGETS}
    params = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds_cfg)
    notes["optimizer"] = type(engine.optimizer).__name__
    notes["precision"] = "DeepSpeed bf16 (bf16 params, fp32 master)"

    def step():
        engine.step()

    return engine, model, step, notes


def build_qlora_base(cfg, args, device, notes):
    """The base with its decoder linears as bitsandbytes NF4 (Linear4bit, quant_storage bf16)."""
    import bitsandbytes as bnb
    from transformers import LlamaForCausalLM
    notes["bitsandbytes"] = bnb.__version__
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, lin in list(parent.named_children()):
                if name not in LORA_TARGETS:
                    continue
                q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                      compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4",
                                      quant_storage=torch.bfloat16)
                q.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, compress_statistics=True,
                                             quant_type="nf4", quant_storage=torch.bfloat16)
                setattr(parent, name, q)
    model = model.to(device)  # Params4bit quantize on the move to the GPU
    for p in model.parameters():
        p.requires_grad_(False)
    notes["qlora"] = "bnb Linear4bit nf4, blocksize 64, double quant, quant_storage bf16"
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("fsdp2", "deepspeed"), required=True)
    p.add_argument("--model", default="llama3-8b", choices=("llama3-8b", "llama3.2-1b"))
    p.add_argument("--layers", type=int, default=0, help="override the layer count (0: the shape's)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--checkpoint-activations", action="store_true")
    p.add_argument("--lora", type=int, default=0, help="peft LoRA rank (deepspeed only); 0: full training")
    p.add_argument("--qlora", action="store_true", help="with --lora: NF4 base (bitsandbytes)")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke test (gloo)")
    a = p.parse_args()
    if a.lora and a.mode != "deepspeed":
        raise SystemExit("--lora is the peft + DeepSpeed ZeRO-3 anchor: use it with --mode deepspeed")
    if a.qlora and not a.lora:
        raise SystemExit("--qlora needs --lora R")

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if a.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:  # a smoke test of the script on CPU ranks (gloo; FSDP2 only)
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    cfg = llama_config(a.model, a.layers)

    t_build = time.perf_counter()
    if a.mode == "fsdp2":
        fwd_model, model, step, notes = build_fsdp2(cfg, a, device)
    else:
        fwd_model, model, step, notes = build_deepspeed(cfg, a, device)
    model.train()
    dist.barrier()
    build_s = time.perf_counter() - t_build

    cuda = device.type == "cuda"

    def mark():  # a phase boundary: synchronized, so the peaks are the phases'
        if cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            return time.perf_counter(), peak
        return time.perf_counter(), 0

    g = torch.Generator(device=device).manual_seed(a.seed + rank)
    times, phase_ms, phase_peak = [], {k: [] for k in PHASES}, {k: 0.0 for k in PHASES}
    loss = None
    for s in range(a.warmup + a.steps):
        x = torch.randint(0, cfg.vocab_size, (a.micro_batch, a.seq), device=device, generator=g)
        dist.barrier()
        marks = [mark()]
        loss = fwd_model(input_ids=x, labels=x).loss
        marks.append(mark())
        if a.mode == "deepspeed":
            fwd_model.backward(loss)
        else:
            loss.backward()
        marks.append(mark())
        step()
        marks.append(mark())
        if s >= a.warmup:
            times.append((marks[-1][0] - marks[0][0]) * 1000)
            for i, k in enumerate(PHASES):
                phase_ms[k].append((marks[i + 1][0] - marks[i][0]) * 1000)
                phase_peak[k] = max(phase_peak[k], marks[i + 1][1] / 2**30)
    # The job's figures: the slowest rank's median, the largest peak.
    med = torch.tensor([statistics.median(times)] + [statistics.median(phase_ms[k]) for k in PHASES] +
                       [phase_peak[k] for k in PHASES], dtype=torch.float64, device=device)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    med = med.tolist()
    ms = med[0]
    n_params = n_params_of(cfg)
    fpt = flops_per_token(cfg, n_params, a.seq)
    tokens_per_s = world * a.micro_batch * a.seq / (ms / 1000)
    out = {
        "anchor": {"fsdp2": "torch FSDP2", "deepspeed": f"DeepSpeed {notes.get('deepspeed', '')} ZeRO-3"}[a.mode]
                  + (" + peft LoRA" if a.lora and not a.qlora else "") + (" + peft QLoRA (bnb nf4)" if a.qlora else ""),
        "mode": a.mode, "model": a.model, "layers": cfg.num_hidden_layers, "n_params": n_params,
        "world": world, "micro_batch": a.micro_batch, "seq": a.seq,
        "checkpoint_activations": a.checkpoint_activations, "lora": a.lora, "qlora": a.qlora,
        "ms_per_iter": ms, "phase_ms": dict(zip(PHASES, med[1:4])), "phase_sync": True, "phase_peak_gib": dict(zip(PHASES, med[4:7])),
        "peak_gib": max(med[4:7]), "tokens_per_s": tokens_per_s, "flops_per_token": fpt,
        "mfu": tokens_per_s / world * fpt / (a.peak_tflops * 1e12), "build_s": build_s,
        "loss": loss.item(), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "notes": {k: v for k, v in notes.items() if k != "config"},
    }
    if rank == 0:
        print(json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
