#!/usr/bin/env python3
"""The Llama anchors of scripts/device/llama8b_2gpu.sh: transformers' LlamaForCausalLM (sdpa
attention, random weights) trained on several GPUs (torchrun) the way users of each framework
run it, next to `zerotrain train --model llama3-8b` at ZeRO-3:

  fsdp2      torch FSDP2 (fully_shard per decoder layer and the root), fp32 parameters with
             MixedPrecisionPolicy(param bf16, reduce fp32), fused AdamW; built on the meta
             device and materialized sharded (no rank holds the whole model)
  deepspeed  DeepSpeed ZeRO-3, bf16 (bf16 parameters, fp32 master), its FusedAdam; the model
             built under deepspeed.zero.Init (partitioned as it is built). --zero-stage 0, 1
             or 2: the model built on the device, cast to bf16 by deepspeed.initialize; at
             stage 0 DeepSpeed wraps FusedAdam in its FP16_Optimizer (bf16, fp32 master
             copy), at 1-2 in DeepSpeedZeroOptimizer (fp32 master partition); the classes are
             in notes.optimizer / notes.basic_optimizer (llama1b_rows.sh: stage 1 and 0, 1 GPU)
  --lora R   (deepspeed only) peft LoRA of rank R on every linear of the decoder (q/k/v/o,
             gate/up/down), the base frozen and partitioned by ZeRO-3 -- Hugging Face's
             documented way to LoRA-fine-tune with ZeRO-3
  --qlora    with --lora: the base linears as bitsandbytes NF4 (Linear4bit, blocksize 64,
             double quantization, quant_storage bf16 so ZeRO-3 can partition them), as
             Hugging Face documents QLoRA with ZeRO-3; needs the bitsandbytes package
  single     one GPU, no DeepSpeed (issue 21's rows): transformers + peft LoRA (--lora R) on a
             bf16 base, or with --qlora on a bitsandbytes NF4 base, torch AdamW on the adapters
             (fp32: peft's autocast_adapter_dtype); plain python or torchrun with one process

In single mode, and with --qlora in deepspeed mode, the frozen base is built on the meta device and materialized on the GPU one
module at a time in bf16 (matrices N(0, initializer_range), norms 1, as transformers'
_init_weights), and with --qlora each decoder layer's seven linears become bitsandbytes
Linear4bit right after the layer is drawn (quantized on the GPU), as transformers' quantized
from_pretrained loads a checkpoint: the base is never whole in fp32, nor on the host (build_s
in the JSON line). Random weights with the same distribution as LlamaForCausalLM(cfg)'s init,
not the same values.

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
        # zerotrain's llama-tiny (a CPU smoke test of the script)
        "llama-tiny": dict(vocab_size=256, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                           rope_theta=10000.0, tie_word_embeddings=False),
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
        "zero_optimization": ({"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                               "stage3_gather_16bit_weights_on_model_save": False} if args.zero_stage == 3
                              else {"stage": args.zero_stage}),  # below 3: DeepSpeed's defaults
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
        model = build_frozen_base(cfg, args, device, notes)
    elif args.zero_stage < 3:  # whole on the device; deepspeed.initialize casts it to bf16
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    else:
        with deepspeed.zero.Init(config_dict_or_path=ds_cfg, dtype=torch.bfloat16):
            model = LlamaForCausalLM(cfg)
    if args.checkpoint_activations:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.lora:
        model = add_lora(model, args, notes)
    params = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds_cfg)
    notes["optimizer"] = type(engine.optimizer).__name__
    notes["basic_optimizer"] = type(engine.basic_optimizer).__name__
    notes["precision"] = "DeepSpeed bf16 (bf16 params, fp32 master)"

    def step():
        engine.step()

    return engine, model, step, notes


def init_like_transformers_(module, std):
    """transformers' LlamaPreTrainedModel._init_weights on a materialized module: matrices
    (Linear, Embedding) N(0, std), biases 0, RMSNorm weights 1 (no padding_idx in these configs)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, std)


def to_linear4bit(lin, device):
    """lin (bf16 on `device`) as a bitsandbytes Linear4bit: NF4, blocksize 64, double quantization,
    bf16 compute and quant_storage (so ZeRO-3 can partition it); quantized on the move to device."""
    import bitsandbytes as bnb
    with torch.device("meta"):  # no host weight to allocate and draw
        q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None,
                              compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4",
                              quant_storage=torch.bfloat16)
    q.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, compress_statistics=True, quant_type="nf4",
                                 quant_storage=torch.bfloat16)
    if lin.bias is not None:
        q.bias = torch.nn.Parameter(lin.bias.data, requires_grad=False)
    return q.to(device)  # Params4bit quantizes here (quantize_4bit on the device)


def build_frozen_base(cfg, args, device, notes):
    """The frozen base for --lora: on the meta device, then each module materialized on `device` in
    bf16 and drawn there; with --qlora each decoder layer's LORA_TARGETS linears replaced by NF4
    Linear4bit as soon as the layer is drawn. Peak: the NF4 (or bf16) base plus one layer in bf16."""
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    if args.qlora:
        try:
            import bitsandbytes as bnb
        except ImportError as e:
            raise SystemExit(f"--qlora needs bitsandbytes (carry .whl-bnb): {e}")
        notes["bitsandbytes"] = bnb.__version__
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model.to(torch.bfloat16)  # on meta: the dtype only
    torch.manual_seed(args.seed)
    std = cfg.initializer_range
    tops = [model.model.embed_tokens, model.model.norm] + ([] if cfg.tie_word_embeddings else [model.lm_head])
    for m in tops:
        m.to_empty(device=device)
        init_like_transformers_(m, std)
    for layer in model.model.layers:
        layer.to_empty(device=device)
        init_like_transformers_(layer, std)
        if args.qlora:
            for parent in (layer.self_attn, layer.mlp):
                for name, lin in list(parent.named_children()):
                    if name in LORA_TARGETS:
                        setattr(parent, name, to_linear4bit(lin, device))
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary_emb = LlamaRotaryEmbedding(cfg, device=device)  # its buffers were on meta
    for p in model.parameters():
        p.requires_grad_(False)
    if args.qlora:
        n4 = sum(type(m).__name__ == "Linear4bit" for m in model.modules())
        assert n4 == len(LORA_TARGETS) * cfg.num_hidden_layers, f"{n4} Linear4bit modules"
        notes["nf4_linears"] = n4
    notes["base_build_s"] = time.perf_counter() - t0
    notes["base"] = ("meta, then per layer on the device in bf16" +
                     (", decoder linears to bnb Linear4bit nf4 (blocksize 64, double quant, quant_storage bf16) "
                      "as each layer is drawn" if args.qlora else ""))
    return model


def add_lora(model, args, notes):
    from peft import LoraConfig, get_peft_model
    lc = LoraConfig(r=args.lora, lora_alpha=2 * args.lora, lora_dropout=0.0, target_modules=LORA_TARGETS,
                    task_type="CAUSAL_LM")
    notes["peft"] = {"r": args.lora, "alpha": 2 * args.lora, "targets": LORA_TARGETS}
    return get_peft_model(model, lc)  # adapters in fp32 (autocast_adapter_dtype)


def build_single(cfg, args, device):
    """One GPU: transformers + peft on the bf16 or NF4 base, torch AdamW on the adapters."""
    torch.manual_seed(args.seed)
    notes = {}
    model = build_frozen_base(cfg, args, device, notes)
    if args.checkpoint_activations:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = add_lora(model, args, notes)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            fused=device.type == "cuda")
    notes["optimizer"] = "torch AdamW" + ("(fused=True)" if device.type == "cuda" else "") + " on the adapters"
    notes["precision"] = "bf16 base" + (" (NF4 storage)" if args.qlora else "") + ", fp32 adapters"

    def step():
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, model, step, notes


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("fsdp2", "deepspeed", "single"), required=True)
    p.add_argument("--model", default="llama3-8b", choices=("llama3-8b", "llama3.2-1b", "llama-tiny"))
    p.add_argument("--layers", type=int, default=0, help="override the layer count (0: the shape's)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--checkpoint-activations", action="store_true")
    p.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=3,
                   help="deepspeed mode: ZeRO stage (3: built under zero.Init)")
    p.add_argument("--lora", type=int, default=0, help="peft LoRA rank (deepspeed only); 0: full training")
    p.add_argument("--qlora", action="store_true", help="with --lora: NF4 base (bitsandbytes)")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke test (gloo)")
    a = p.parse_args()
    if a.lora and a.mode == "fsdp2":
        raise SystemExit("--lora is the peft anchor: use it with --mode deepspeed (ZeRO-3) or --mode single (one GPU)")
    if a.mode == "single" and not a.lora:
        raise SystemExit("--mode single is the one-GPU peft anchor: give --lora R (and --qlora for NF4)")
    if a.qlora and not a.lora:
        raise SystemExit("--qlora needs --lora R")
    if a.zero_stage != 3 and (a.mode != "deepspeed" or a.qlora):
        raise SystemExit("--zero-stage below 3 is for --mode deepspeed without --qlora")

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # single without torchrun: no process group (one process, nothing to reduce).
    use_dist = a.mode != "single" or "WORLD_SIZE" in os.environ
    if a.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        if use_dist:
            dist.init_process_group("nccl", device_id=device)
    else:  # a smoke test of the script on CPU ranks (gloo; FSDP2, or single)
        device = torch.device("cpu")
        if use_dist:
            dist.init_process_group("gloo")
    world, rank = (dist.get_world_size(), dist.get_rank()) if use_dist else (1, 0)
    if a.mode == "single" and world != 1:
        raise SystemExit(f"--mode single runs on one GPU; this job has {world} processes")
    cfg = llama_config(a.model, a.layers)
    cfg.use_cache = False  # training: no KV cache

    def barrier():
        if use_dist:
            dist.barrier()

    t_build = time.perf_counter()
    if a.mode == "fsdp2":
        fwd_model, model, step, notes = build_fsdp2(cfg, a, device)
    elif a.mode == "single":
        fwd_model, model, step, notes = build_single(cfg, a, device)
    else:
        fwd_model, model, step, notes = build_deepspeed(cfg, a, device)
    model.train()
    barrier()
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
        barrier()
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
    if use_dist:
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
    med = med.tolist()
    ms = med[0]
    n_params = n_params_of(cfg)
    fpt = flops_per_token(cfg, n_params, a.seq)
    tokens_per_s = world * a.micro_batch * a.seq / (ms / 1000)
    out = {
        "anchor": {"fsdp2": "torch FSDP2", "deepspeed": f"DeepSpeed {notes.get('deepspeed', '')} ZeRO-{a.zero_stage}",
                   "single": "transformers (1 GPU)"}[a.mode]
                  + (" + peft LoRA" if a.lora and not a.qlora else "") + (" + peft QLoRA (bnb nf4)" if a.qlora else ""),
        "mode": a.mode, "model": a.model, "layers": cfg.num_hidden_layers, "n_params": n_params,
        "world": world, "micro_batch": a.micro_batch, "seq": a.seq,
        "checkpoint_activations": a.checkpoint_activations, "zero_stage": a.zero_stage if a.mode == "deepspeed" else None, "lora": a.lora, "qlora": a.qlora,
        "ms_per_iter": ms, "phase_ms": dict(zip(PHASES, med[1:4])), "phase_sync": True, "phase_peak_gib": dict(zip(PHASES, med[4:7])),
        "peak_gib": max(med[4:7]), "tokens_per_s": tokens_per_s, "flops_per_token": fpt,
        "mfu": tokens_per_s / world * fpt / (a.peak_tflops * 1e12), "build_s": build_s,
        "loss": loss.item(), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "notes": {k: v for k, v in notes.items() if k != "config"},
    }
    if rank == 0:
        print(json.dumps(out), flush=True)
    if use_dist:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
