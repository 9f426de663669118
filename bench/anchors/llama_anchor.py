#!/usr/bin/env python3
"""The Llama anchor of scripts/device/llama_1gpu.sh and llama1b_rows.sh: transformers'
LlamaForCausalLM (sdpa attention) with the Llama-3.2-1B shape (random weights), fp32 parameters
+ autocast bf16, gradient clipping at --clip (default 1.0) and torch's fused AdamW on one GPU --
the plain-PyTorch counterpart of `zerotrain train --model llama3.2-1b` at ZeRO-0 bf16 (fp32
master weights). Random token batches, as zerotrain's `--data random`.

--compile: torch.compile (default mode, dynamic=False) of the forward -- the model and the
cross-entropy on its fp32-cast logits in one graph, so inductor may fuse the loss into the head;
the backward is compiled with it (AOTAutograd). Clipping and the optimizer step stay eager (fused
AdamW). Compilation happens in the warm-up steps; compile_s is the first step's time.

Prints one JSON line: ms/iter (median of the timed steps, each synchronized), tokens/s, peak GiB
(torch.cuda.max_memory_allocated over all steps, warm-up included), FLOPs per token by zerotrain's
formula 6(N_layers + V d) + 12 L d T (llama_dist_anchor.flops_per_token; N_layers: the
parameters without the embedding table) and MFU at --peak-tflops (989: H100 SXM dense bf16).
--model llama-tiny --device cpu is a smoke test of the script (autocast bf16 on CPU)."""
import argparse, json, statistics, time

import torch
import transformers
from transformers import LlamaForCausalLM

from llama_dist_anchor import flops_per_token, llama_config, n_params_of


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama3.2-1b", choices=("llama3.2-1b", "llama-tiny"))
    p.add_argument("--layers", type=int, default=0, help="override the layer count (0: the shape's, 16 for the 1B)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--clip", type=float, default=1.0, help="clip_grad_norm_ max norm (0: no clipping)")
    p.add_argument("--compile", action="store_true", help="torch.compile the forward + loss (default mode)")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke test")
    a = p.parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    cfg = llama_config(a.model, a.layers)
    cfg.use_cache = False  # training: no KV cache
    torch.manual_seed(1234)
    model = LlamaForCausalLM(cfg).to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)

    def forward_loss(inputs, targets):
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = model(input_ids=inputs).logits
            return torch.nn.functional.cross_entropy(logits.float().view(-1, cfg.vocab_size), targets.reshape(-1))

    if a.compile:
        forward_loss = torch.compile(forward_loss, dynamic=False)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    g = torch.Generator(device=dev).manual_seed(1)
    times = []
    first_ms = None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for s in range(a.warmup + a.steps):
        x = torch.randint(0, cfg.vocab_size, (a.micro_batch, a.seq + 1), device=dev, generator=g)
        sync()
        t0 = time.perf_counter()
        loss = forward_loss(x[:, :-1], x[:, 1:])
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        ms = (time.perf_counter() - t0) * 1000
        if s == 0:
            first_ms = ms
        if s >= a.warmup:
            times.append(ms)
    ms = statistics.median(times)
    tokens_per_s = a.micro_batch * a.seq / (ms / 1000)
    n_params = n_params_of(cfg)
    fpt = flops_per_token(cfg, n_params, a.seq)
    name = "transformers LlamaForCausalLM + autocast bf16 + fused AdamW" + (" + torch.compile" if a.compile else "")
    print(json.dumps({"anchor": name, "model": a.model, "layers": cfg.num_hidden_layers, "n_params": n_params,
                      "micro_batch": a.micro_batch, "seq": a.seq, "compile": "default" if a.compile else None,
                      "clip": a.clip, "ms_per_iter": ms, "tokens_per_s": tokens_per_s,
                      "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
                      "flops_per_token": fpt, "mfu": tokens_per_s * fpt / (a.peak_tflops * 1e12),
                      "peak_tflops": a.peak_tflops, "compile_s": first_ms / 1000 if a.compile else None,
                      "loss": loss.item(), "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
                      "torch": torch.__version__, "transformers": transformers.__version__}))


if __name__ == "__main__":
    main()
