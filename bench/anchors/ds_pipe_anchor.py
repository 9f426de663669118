"""DeepSpeed pipeline-parallel anchor: GPT-2 trained by DeepSpeed's PipelineModule + engine.train_batch().

Measures DeepSpeed's (0.19.8) pipeline engine (its 1F1B TrainSchedule) on the GPT-2 of gpt2.py, to set
against zerotrain's pipeline engine. Every process is one pipeline stage (pp = world size, dp = 1; or --pp N, dp = world / N).
One iteration = one train_batch() = --micro-batches micro-batches of --micro-batch sequences of --seq
tokens, then the optimizer step.

  layers: wte (TiedLayerSpec 'embed') | + wpe | n_layer Blocks | ln_f | head x @ wte.T (TiedLayerSpec 'embed')
  loss:   cross_entropy(logits.float(), targets) (PipelineModule's loss_fn, on the last stage)

wte and wpe are two pipeline layers, not one: the tied module is only wte, so the last stage holds no
unused wpe copy. Partitioning: 'parameters' (the tied wte counts on both stages). bf16 (DeepSpeed keeps
bf16 params with fp32 master weights, grads accumulated in fp32 by its BF16_Optimizer), AdamW
lr 1e-4 betas (0.9, 0.999) eps 1e-8 wd 0 as DeepSpeed's FusedAdam, gradient clipping 1.0, ZeRO stage 0
(--zero-stage 1: ZeRO-1 over dp, with fp32 grad accumulation, i.e. BF16_Optimizer as well).
Data: one fixed random batch (seed 1234, vocab 50257) fed for every micro-batch.
--ckpt-interval k: DeepSpeed's (reentrant) activation checkpointing of each run of k layers, only of runs
made of Blocks alone (checkpointable_layers; a checkpointed embedding would get no gradient).
Timing: --warmup train_batch calls, then sync + barrier, --steps timed calls, sync + barrier.
  ms_per_iter = timed span / steps; tokens_per_s = micro_batches * micro_batch * seq / (ms/1000).
  peak_gib_per_stage = torch.cuda.max_memory_allocated() of each rank (stage) over the whole run.

Run (2 GPUs, pp 2), from the repository root; rank 0 prints one JSON line and writes it to --out:
  torchrun --nproc_per_node 2 bench/anchors/ds_pipe_anchor.py --model gpt2-xl --micro-batch 4 \
      --seq 1024 --micro-batches 8 --steps 10 --warmup 3 --out result.json
CPU smoke test (gloo, fp32, torch AdamW):
  DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 bench/anchors/ds_pipe_anchor.py --cpu \
      --model gpt2-tiny --micro-batch 2 --seq 64 --micro-batches 4 --steps 2 --warmup 1 --out /tmp/r.json
"""
import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ds_env import torch_cuda_arch_for_deepspeed  # noqa: E402
from gpt2 import CONFIGS, Block, cross_entropy_loss, get_config, num_params  # noqa: E402

GIB = 1024 ** 3


def init_gpt2_(module: nn.Module, n_layer: int) -> nn.Module:
    """gpt2.py's init: weights N(0, 0.02), c_proj N(0, 0.02/sqrt(2L)), biases 0, LayerNorm (1, 0)."""
    with torch.no_grad():
        for name, m in module.named_modules():
            if isinstance(m, nn.Linear):
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj") else 0.02
                nn.init.normal_(m.weight, mean=0.0, std=std)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
    return module


class TokEmbed(nn.Embedding):
    """wte: the tied module (first stage: idx -> wte[idx]; last stage: the head)."""

    def __init__(self, cfg):
        super().__init__(cfg.vocab_size, cfg.n_embd)
        init_gpt2_(self, cfg.n_layer)


def lm_head(wte: TokEmbed, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, wte.weight)  # tied head: x @ wte.T


class PosEmbed(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.wpe = init_gpt2_(nn.Embedding(cfg.n_positions, cfg.n_embd), cfg.n_layer)

    def forward(self, x):
        return x + self.wpe(torch.arange(x.size(1), device=x.device))


class PipeBlock(Block):
    def __init__(self, cfg):
        super().__init__(cfg)
        init_gpt2_(self, cfg.n_layer)


class FinalNorm(nn.LayerNorm):
    def __init__(self, cfg):
        super().__init__(cfg.n_embd, eps=1e-5)


def loss_fn(logits, targets):
    return cross_entropy_loss(logits, targets)


def ds_config(args):
    zero = {"stage": args.zero_stage}
    params = {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    if args.cpu:
        params.update(torch_adam=True, adam_w_mode=True)  # torch.optim.AdamW (FusedAdam needs CUDA)
    cfg = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.micro_batches,
        "bf16": {"enabled": not args.cpu},
        "optimizer": {"type": "AdamW", "params": params},
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if args.zero_stage == 1 and not args.cpu:
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}  # BF16_Optimizer's ZeRO-1, as stage 0's fp32 accum
    return cfg


def run(args, rank, world, device, out):
    import deepspeed
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    out["deepspeed"] = deepspeed.__version__
    cfg = get_config(args.model)
    if args.seq > cfg.n_positions:
        raise ValueError(f"--seq {args.seq} > n_positions {cfg.n_positions} of {args.model}")
    torch.manual_seed(1234)
    layers = ([TiedLayerSpec("embed", TokEmbed, cfg), LayerSpec(PosEmbed, cfg)]
              + [LayerSpec(PipeBlock, cfg) for _ in range(cfg.n_layer)]
              + [LayerSpec(FinalNorm, cfg), TiedLayerSpec("embed", TokEmbed, cfg, forward_fn=lm_head)])
    pp = args.pp or world
    model = PipelineModule(layers=layers, num_stages=pp, loss_fn=loss_fn, partition_method="parameters",
                           activation_checkpoint_interval=args.ckpt_interval,
                           checkpointable_layers=["PipeBlock"])  # reentrant ckpt of the embedding breaks
    config = ds_config(args)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()
                                                                          if p.requires_grad], config=config)
    out["parts"] = [int(i) for i in model.parts]  # layer index boundaries of the stages
    out["optimizer"] = f"{type(engine.optimizer).__name__}({type(engine.basic_optimizer).__name__})"

    g = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, cfg.vocab_size, (args.micro_batch, args.seq + 1), generator=g).to(device)
    batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())

    def batches():
        while True:
            yield batch

    data = batches()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        engine.train_batch(data_iter=data)
    sync()
    torch.distributed.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = engine.train_batch(data_iter=data)
    sync()
    torch.distributed.barrier()
    ms = (time.perf_counter() - t0) * 1e3 / args.steps

    peak = torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None
    ranks = [None] * world
    torch.distributed.all_gather_object(ranks, (engine.stage_id, peak))
    peaks = [None] * pp  # a stage's peak: the largest of its dp replicas
    for stage, pk in ranks:
        peaks[stage] = pk if peaks[stage] is None or pk is None else max(peaks[stage], pk)
    dp = world // pp
    out.update(ms_per_iter=ms, tokens_per_s=dp * args.micro_batches * args.micro_batch * args.seq / (ms / 1e3),
               peak_gib_per_stage=peaks, peak_gib_per_rank=[pk for _, pk in ranks], dp=dp, loss_last=float(loss))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gpt2-xl", choices=list(CONFIGS))
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--micro-batches", type=int, default=8, help="gradient_accumulation_steps")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--zero-stage", type=int, default=0, choices=[0, 1])
    p.add_argument("--pp", type=int, default=0, help="pipeline stages (default: world size); dp = world / pp")
    p.add_argument("--ckpt-interval", type=int, default=0, help="activation_checkpoint_interval")
    p.add_argument("--out", default="ds_pipe_result.json")
    p.add_argument("--cpu", action="store_true", help="testing: CPU, gloo, fp32, torch AdamW")
    args = p.parse_args()
    if args.steps < 1:
        p.error("--steps must be >= 1")

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    out = {"anchor": "deepspeed-pipe", "model": args.model, "params": num_params(get_config(args.model)),
           "pp": args.pp or world, "micro_batch": args.micro_batch, "micro_batches": args.micro_batches, "seq": args.seq,
           "zero_stage": args.zero_stage, "ckpt_interval": args.ckpt_interval,
           "dtype": "fp32" if args.cpu else "bf16"}
    try:
        if args.cpu:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
            device = torch.device("cpu")
        else:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device)
            changed = torch_cuda_arch_for_deepspeed(device)
            if changed:
                out["torch_cuda_arch_list"] = changed
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo" if args.cpu else "nccl")
        run(args, rank, world, device, out)
        out["status"] = "ok"
    except BaseException as e:  # noqa: BLE001  (SystemExit included: one JSON line either way)
        traceback.print_exc()
        out.update(status="error", error=f"{type(e).__name__}: {e}")
    if rank == 0:
        line = json.dumps(out, default=str)
        with open(args.out, "w") as f:
            f.write(line + "\n")
        print(line, flush=True)
    if out["status"] != "ok":
        sys.stdout.flush()
        os._exit(1)  # a peer may be stuck in a collective: do not wait for the process group
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
