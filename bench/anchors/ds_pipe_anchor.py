"""DeepSpeed pipeline-parallel anchor: GPT-2 or a Llama shape trained by DeepSpeed's PipelineModule + engine.train_batch().

Measures DeepSpeed's (0.19.8) pipeline engine (its 1F1B TrainSchedule) on the GPT-2 of gpt2.py, or on a Llama
shape built from Hugging Face transformers' Llama modules, to set against zerotrain's pipeline engine
(bench/bench_pipe_bubble.cpp). Every process is one pipeline stage (pp = world size, dp = 1; or --pp N, dp = world / N).
One iteration = one train_batch() = --micro-batches micro-batches of --micro-batch sequences of --seq
tokens, then the optimizer step.

GPT-2 (--model gpt2, gpt2-xl, ...):
  layers: wte (TiedLayerSpec 'embed') | + wpe | n_layer Blocks | ln_f | head x @ wte.T (TiedLayerSpec 'embed')
  wte and wpe are two pipeline layers, not one: the tied module is only wte, so the last stage holds no
  unused wpe copy. Init as gpt2.py (N(0, 0.02), c_proj N(0, 0.02/sqrt(2L))).
Llama (--model llama3.2-1b, llama3-8b, llama-tiny; the shapes of llama_dist_anchor.llama_config: transformers'
LlamaConfig with sdpa attention, rms_norm_eps 1e-5; Llama-3.2-1B: hidden 2048, intermediate 8192, 16 layers,
32 heads / 8 kv heads, head_dim 64, vocab 128256, rope_theta 5e5 with rope_scaling llama3 (factor 32, low 1,
high 4, original 8192) as its HF config.json, tied embeddings; --layers N overrides the layer count):
  layers: embed_tokens (nn.Embedding, TiedLayerSpec 'embed' when tie_word_embeddings) | num_hidden_layers
          transformers LlamaDecoderLayers | final LlamaRMSNorm | head x @ embed_tokens.weight.T (TiedLayerSpec
          'embed'; an untied shape: its own bias-free lm_head Linear)
  Each decoder layer is transformers' LlamaDecoderLayer itself (subclassed for a one-tensor forward): only the
  hidden state (B, T, d) travels between layers and stages, as DeepSpeed pipes tensors; each layer computes its
  RoPE (cos, sin) with transformers' LlamaRotaryEmbedding for positions 0..T-1 (the llama3 scaling included),
  once per sequence length and cached, from fp32 inverse frequencies kept out of the module's parameters and
  buffers (DeepSpeed's bf16 cast would round them), exactly what LlamaModel computes once per forward and hands
  to every layer. Causal attention through sdpa with no mask (is_causal: flash attention on the GPU).
  Init as transformers' _init_weights: Linear and Embedding N(0, initializer_range 0.02), RMSNorm 1.
  This is the standard way to run a Hugging Face model under DeepSpeed's PipelineModule: the model's own
  modules as LayerSpecs, no fused kernels beyond what transformers uses by default.
loss:   cross_entropy(logits.float(), targets) (PipelineModule's loss_fn, on the last stage), both models.

Partitioning: 'parameters' (the tied embedding counts on both stages), as zerotrain's default. bf16 (DeepSpeed
keeps bf16 params with fp32 master weights, grads accumulated in fp32 by its BF16_Optimizer), AdamW
lr 1e-4 betas (0.9, 0.999) eps 1e-8 wd 0 as DeepSpeed's FusedAdam, gradient clipping 1.0, ZeRO stage 0
(--zero-stage 1: ZeRO-1 over dp, with fp32 grad accumulation, i.e. BF16_Optimizer as well).
Data: one fixed random batch (seed 1234, the model's vocabulary) fed for every micro-batch.
--ckpt-interval k: DeepSpeed's (reentrant) activation checkpointing of each run of k layers, only of runs
made of Blocks / decoder layers alone (checkpointable_layers; a checkpointed embedding would get no gradient).
Timing: --warmup train_batch calls, then sync + barrier, --steps timed calls, sync + barrier.
  ms_per_iter = timed span / steps; tokens_per_s = micro_batches * micro_batch * seq / (ms/1000).
  peak_gib_per_stage = torch.cuda.max_memory_allocated() of each rank (stage) over the whole run.

Run (2 GPUs, pp 2), from the repository root; rank 0 prints one JSON line and writes it to --out:
  torchrun --nproc_per_node 2 bench/anchors/ds_pipe_anchor.py --model gpt2-xl --micro-batch 4 \
      --seq 1024 --micro-batches 8 --steps 10 --warmup 3 --out result.json
  torchrun --nproc_per_node 2 bench/anchors/ds_pipe_anchor.py --model llama3.2-1b --micro-batch 4 \
      --seq 2048 --micro-batches 8 --steps 5 --warmup 2 --out result.json
CPU smoke tests (gloo, fp32, torch AdamW):
  DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 bench/anchors/ds_pipe_anchor.py --cpu \
      --model gpt2-tiny --micro-batch 2 --seq 64 --micro-batches 4 --steps 2 --warmup 1 --out /tmp/r.json
  DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 bench/anchors/ds_pipe_anchor.py --cpu \
      --model llama-tiny --layers 4 --micro-batch 2 --seq 64 --micro-batches 4 --steps 2 --warmup 1 --out /tmp/r.json
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


def gpt2_specs(args):
    """GPT-2's pipeline layers: (layer specs, checkpointable layer class names, vocabulary, parameters)."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    cfg = get_config(args.model)
    if args.seq > cfg.n_positions:
        raise ValueError(f"--seq {args.seq} > n_positions {cfg.n_positions} of {args.model}")
    layers = ([TiedLayerSpec("embed", TokEmbed, cfg), LayerSpec(PosEmbed, cfg)]
              + [LayerSpec(PipeBlock, cfg) for _ in range(cfg.n_layer)]
              + [LayerSpec(FinalNorm, cfg), TiedLayerSpec("embed", TokEmbed, cfg, forward_fn=lm_head)])
    return layers, ["PipeBlock"], cfg.vocab_size, num_params(cfg)


LLAMA_MODELS = ("llama3.2-1b", "llama3-8b", "llama-tiny")


def llama_specs(args):
    """A Llama shape's pipeline layers from transformers' modules (see the module docstring):
    (layer specs, checkpointable layer class names, vocabulary, parameters)."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

    from llama_dist_anchor import llama_config, n_params_of

    cfg = llama_config(args.model, args.layers)
    cfg.use_cache = False  # training: no KV cache
    if args.seq > cfg.max_position_embeddings:
        raise ValueError(f"--seq {args.seq} > max_position_embeddings {cfg.max_position_embeddings} of {args.model}")

    def init_(module):  # transformers' _init_weights: matrices N(0, initializer_range); RMSNorm keeps 1
        with torch.no_grad():
            for m in module.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, mean=0.0, std=cfg.initializer_range)
                    if getattr(m, "bias", None) is not None:
                        nn.init.zeros_(m.bias)
        return module

    class LlamaEmbed(nn.Embedding):
        """model.embed_tokens (the tied module when tie_word_embeddings: first stage idx -> E[idx], last the head)."""

        def __init__(self):
            super().__init__(cfg.vocab_size, cfg.hidden_size)
            init_(self)

    def tied_head(embed, x):
        return F.linear(x, embed.weight)  # lm_head tied to embed_tokens: x @ E.T

    class LlamaHead(nn.Linear):
        """An untied lm_head."""

        def __init__(self):
            super().__init__(cfg.hidden_size, cfg.vocab_size, bias=False)
            init_(self)

    class PipeLlamaDecoderLayer(LlamaDecoderLayer):
        """transformers' LlamaDecoderLayer, hidden state in and out; RoPE of positions 0..T-1 computed here."""

        def __init__(self, layer_idx):
            super().__init__(cfg, layer_idx)
            init_(self)
            # Not a submodule: its fp32 inv_freq stays fp32 under DeepSpeed's bf16 cast of the module.
            self.__dict__["_rope"] = LlamaRotaryEmbedding(cfg)
            self.__dict__["_rope_cache"] = {}

        def position_embeddings(self, x):
            key = (x.size(1), x.device, x.dtype)
            if key not in self._rope_cache:  # LlamaModel's position_embeddings, once per (T, device, dtype)
                with torch.no_grad():
                    self._rope.to(x.device)
                    pos = torch.arange(x.size(1), device=x.device).unsqueeze(0)
                    self._rope_cache[key] = self._rope(x, pos)
            return self._rope_cache[key]

        def forward(self, x):
            out = super().forward(x, attention_mask=None, position_embeddings=self.position_embeddings(x))
            return out[0] if isinstance(out, tuple) else out  # transformers 4 returns a tuple

    class LlamaFinalNorm(LlamaRMSNorm):
        """model.norm."""

        def __init__(self):
            super().__init__(cfg.hidden_size, eps=cfg.rms_norm_eps)

    tied = cfg.tie_word_embeddings
    layers = ([TiedLayerSpec("embed", LlamaEmbed) if tied else LayerSpec(LlamaEmbed)]
              + [LayerSpec(PipeLlamaDecoderLayer, i) for i in range(cfg.num_hidden_layers)]
              + [LayerSpec(LlamaFinalNorm),
                 TiedLayerSpec("embed", LlamaEmbed, forward_fn=tied_head) if tied else LayerSpec(LlamaHead)])
    return layers, ["PipeLlamaDecoderLayer"], cfg.vocab_size, n_params_of(cfg)


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
    from deepspeed.pipe import PipelineModule

    out["deepspeed"] = deepspeed.__version__
    if args.model in LLAMA_MODELS:
        import transformers
        out["transformers"] = transformers.__version__
        layers, checkpointable, vocab, n_params = llama_specs(args)
    else:
        layers, checkpointable, vocab, n_params = gpt2_specs(args)
    out["params"] = n_params
    torch.manual_seed(1234)
    pp = args.pp or world
    model = PipelineModule(layers=layers, num_stages=pp, loss_fn=loss_fn, partition_method=args.partition,
                           activation_checkpoint_interval=args.ckpt_interval,
                           checkpointable_layers=checkpointable)  # reentrant ckpt of the embedding breaks
    config = ds_config(args)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()
                                                                          if p.requires_grad], config=config)
    out["parts"] = [int(i) for i in model.parts]  # layer index boundaries of the stages
    out["optimizer"] = f"{type(engine.optimizer).__name__}({type(engine.basic_optimizer).__name__})"

    g = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, vocab, (args.micro_batch, args.seq + 1), generator=g).to(device)
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
    p.add_argument("--model", default="gpt2-xl", choices=list(CONFIGS) + list(LLAMA_MODELS))
    p.add_argument("--layers", type=int, default=0, help="a Llama's decoder layers (0: its shape's)")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--micro-batches", type=int, default=8, help="gradient_accumulation_steps")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--zero-stage", type=int, default=0, choices=[0, 1])
    p.add_argument("--pp", type=int, default=0, help="pipeline stages (default: world size); dp = world / pp")
    p.add_argument("--ckpt-interval", type=int, default=0, help="activation_checkpoint_interval")
    p.add_argument("--partition", default="parameters",
                   help="PipelineModule's partition_method: parameters (its default), uniform or type:REGEX")
    p.add_argument("--out", default="ds_pipe_result.json")
    p.add_argument("--cpu", action="store_true", help="testing: CPU, gloo, fp32, torch AdamW")
    args = p.parse_args()
    if args.steps < 1:
        p.error("--steps must be >= 1")

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    out = {"anchor": "deepspeed-pipe", "model": args.model, "layers": args.layers or None,
           "pp": args.pp or world, "micro_batch": args.micro_batch, "micro_batches": args.micro_batches, "seq": args.seq,
           "zero_stage": args.zero_stage, "ckpt_interval": args.ckpt_interval, "partition": args.partition,
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
