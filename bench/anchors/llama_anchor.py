#!/usr/bin/env python3
"""The Llama anchor of scripts/device/llama_1gpu.sh: transformers' LlamaForCausalLM (sdpa
attention) with the Llama-3.2-1B shape (random weights), fp32 parameters + autocast bf16 and
torch's fused AdamW on one GPU -- the plain-PyTorch counterpart of `zerotrain train --model
llama3.2-1b` at ZeRO-0 bf16 (fp32 master weights). Random token batches, as zerotrain's
`--data random`. Prints one JSON line: ms/iter (median of the timed steps), tokens/s, peak GiB."""
import argparse, json, statistics, time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layers", type=int, default=16)
    a = p.parse_args()
    cfg = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=a.layers,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                      rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
                      rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                      attn_implementation="sdpa")
    torch.manual_seed(1234)
    model = LlamaForCausalLM(cfg).cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
    g = torch.Generator(device="cuda").manual_seed(1)
    times = []
    torch.cuda.reset_peak_memory_stats()
    for s in range(a.warmup + a.steps):
        x = torch.randint(0, cfg.vocab_size, (a.micro_batch, a.seq + 1), device="cuda", generator=g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, cfg.vocab_size), x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if s >= a.warmup:
            times.append((time.perf_counter() - t0) * 1000)
    ms = statistics.median(times)
    print(json.dumps({"anchor": "transformers LlamaForCausalLM + autocast bf16 + fused AdamW", "ms_per_iter": ms,
                      "tokens_per_s": a.micro_batch * a.seq / (ms / 1000),
                      "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "loss": loss.item()}))


if __name__ == "__main__":
    main()
