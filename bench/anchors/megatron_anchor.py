#!/usr/bin/env python3
"""Megatron-core tensor-parallel anchor: GPT-2 XL or the Llama-3.2-3B shape trained by
megatron-core 0.19.2 (pip megatron-core, no Transformer Engine, no apex) at tp = world size
/ dp, with and without sequence parallelism -- the counterpart of `zerotrain train --tp N`
(scripts/device/tp_2gpu.sh runs both; docs/tensor-parallel.md).

  model      megatron.core.models.gpt.GPTModel with the layer spec of
             gpt_layer_specs.get_gpt_layer_local_spec (Megatron's own ColumnParallelLinear /
             RowParallelLinear / VocabParallelEmbedding, vocab-parallel cross entropy), three
             substitutions, each because the pip wheel lacks what Megatron would use:
               * norms: torch.nn.LayerNorm / RMSNorm whose parameters carry
                 `sequence_parallel` (what apex's FusedLayerNorm sets), so that
                 finalize_model_grads sums their gradients over tp; the local spec's
                 WrappedTorchNorm refuses sequence parallelism without apex;
               * core attention (--attention sdpa, the default): torch's
                 scaled_dot_product_attention (causal, enable_gqa) in place of the local
                 DotProductAttention, which materialises the (b, heads, s, s) scores
                 (--attention local keeps it) -- zerotrain's models call SDPA too;
               * the optimizer: megatron's Float16OptimizerWithFloat16Params (bf16 params,
                 fp32 main params) around torch.optim.AdamW (get_megatron_optimizer's own
                 fallback without TE or apex), distributed optimizer off, clip 1.0.
  gpt2-xl    48 layers, hidden 1600, 25 heads (--heads 20 for tp 2: 25 does not divide; the
             parameters and FLOPs do not depend on the head count), ffn 6400, vocab 50257
             padded to a multiple of 128 x tp (Megatron's --make-vocab-size-divisible-by
             128), seq 1024, learned positions, LayerNorm, biases, GELU (tanh), tied head
  llama3.2-3b  28 layers, hidden 3072, 24 heads, 8 kv heads, ffn 8192 (SwiGLU), vocab
             128256, seq 2048, RMSNorm eps 1e-5, RoPE theta 500000 with Llama 3's scaling
             (factor 32), no biases, tied embedding (as Llama 3.2 3B)
  precision  bf16 parameters and activations (TransformerConfig bf16, params_dtype bf16), fp32
             master weights and Adam state; gradients reduced in fp32 (--grad-reduce-in-fp32,
             Megatron's default with bf16) unless --bf16-grads
  data       random tokens, the same on the tp ranks of a replica (seed 1 + dp rank)
  step       zero_grad_buffer, forward (labels -> per-token loss, mean), backward,
             finalize_model_grads (dp all-reduce; sequence-parallel norm gradients over tp),
             optimizer.step
  timing     --warmup steps, then --steps timed steps, each between cuda synchronizes;
             ms_per_iter = their median; tokens_per_s = dp x micro_batch x seq / (ms / 1000)
             (each replica's tokens once); peak_gib = max over ranks of
             torch.cuda.max_memory_allocated over the whole run

Run (2 GPUs, tp 2), from the repository root, after installing the wheel (scripts/device/tp_2gpu.sh):
  CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc_per_node 2 bench/anchors/megatron_anchor.py \\
      --model gpt2-xl --heads 20 --micro-batch 4 [--sequence-parallel] --out result.json
Rank 0 prints one JSON line and writes it to --out. `--print-config` prints the resolved shape
and exits (no torch needed).
"""
import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
# Megatron's tp layers issue their collectives before the GEMMs they overlap and rely on
# one hardware queue to keep that order (tensor_parallel/layers.py).
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

GIB = 1024 ** 3

# The shapes zerotrain trains under the same names (models/gpt2.h, bench/configs/models/).
SHAPES = {
    "gpt2-xl": dict(family="gpt2", layers=48, hidden=1600, heads=25, kv_heads=None, ffn=6400, vocab=50257,
                    seq=1024, max_positions=1024),
    "llama3.2-3b": dict(family="llama", layers=28, hidden=3072, heads=24, kv_heads=8, ffn=8192, vocab=128256,
                        seq=2048, max_positions=131072, rope_theta=500000.0, rope_factor=32.0),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(SHAPES), default="gpt2-xl")
    p.add_argument("--layers", type=int, default=0, help="override the shape's layer count")
    p.add_argument("--heads", type=int, default=0, help="override the head count (gpt2-xl at tp 2: 20)")
    p.add_argument("--tp", type=int, default=0, help="tensor-parallel size (default: the world size)")
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=0, help="default: the shape's (1024 / 2048)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--attention", choices=["sdpa", "local"], default="sdpa")
    p.add_argument("--bf16-grads", action="store_true", help="reduce gradients in bf16 (default fp32)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", default="")
    p.add_argument("--print-config", action="store_true")
    a = p.parse_args(argv)
    s = dict(SHAPES[a.model])
    if a.layers:
        s["layers"] = a.layers
    if a.heads:
        s["heads"] = a.heads
    if s["kv_heads"] is None:
        s["kv_heads"] = s["heads"]
    if not a.seq:
        a.seq = s["seq"]
    if s["hidden"] % s["heads"] or s["heads"] % s["kv_heads"]:
        p.error(f"hidden {s['hidden']} must divide by heads {s['heads']}, heads by kv heads {s['kv_heads']}")
    if a.seq > s["max_positions"]:
        p.error(f"--seq {a.seq} exceeds the model's {s['max_positions']} positions")
    a.shape = s
    return a


def padded_vocab(vocab, tp, multiple=128):
    """Megatron-LM's _vocab_size_with_padding: up to a multiple of multiple x tp."""
    m = multiple * tp
    return (vocab + m - 1) // m * m


def build(a, tp):
    """The GPTModel of the shape, wrapped in Megatron's DDP (its gradient buffers feed the
    optimizer's main_grad), and its optimizer."""
    import dataclasses

    import torch
    import torch.nn.functional as F
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
    from megatron.core.transformer.transformer_config import TransformerConfig

    s = a.shape
    llama = s["family"] == "llama"

    def gelu_tanh(x):  # GPT-2's activation
        return F.gelu(x, approximate="tanh")

    cfg = TransformerConfig(
        num_layers=s["layers"], hidden_size=s["hidden"], num_attention_heads=s["heads"],
        num_query_groups=s["kv_heads"], ffn_hidden_size=s["ffn"], kv_channels=s["hidden"] // s["heads"],
        normalization="RMSNorm" if llama else "LayerNorm", layernorm_epsilon=1e-5,
        gated_linear_unit=llama, activation_func=F.silu if llama else gelu_tanh, add_bias_linear=not llama,
        hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.02,
        bf16=True, params_dtype=torch.bfloat16, tensor_model_parallel_size=tp,
        sequence_parallel=a.sequence_parallel,
        # Fusions that need apex / TE / Megatron's compiled kernels, none of which the wheel has.
        masked_softmax_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
        cross_entropy_loss_fusion=False, attention_softmax_in_fp32=True)

    class Norm:
        """torch's LayerNorm / RMSNorm on this GPU in the parameter dtype; under sequence
        parallelism each rank normalises its own positions, so the parameters are marked for
        finalize_model_grads' sum over tp (what apex's FusedLayerNorm does)."""

        def __new__(cls, config, hidden_size, eps=1e-5, **_):
            norm = torch.nn.RMSNorm if config.normalization == "RMSNorm" else torch.nn.LayerNorm
            m = norm(hidden_size, eps=eps, device=torch.cuda.current_device(), dtype=config.params_dtype)
            for p in m.parameters():
                setattr(p, "sequence_parallel", config.sequence_parallel)
            return m

    class SdpaAttention(DotProductAttention):
        """Causal attention by torch's SDPA (flash): query (s, b, heads/tp, d), key and value
        (s, b, kv/tp, d) -> (s, b, heads/tp * d), as DotProductAttention.forward returns."""

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            assert attention_bias is None and packed_seq_params is None
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale,
                                               enable_gqa=k.size(1) != q.size(1))
            return y.permute(2, 0, 1, 3).reshape(y.size(2), y.size(0), -1)

    layer = get_gpt_layer_local_spec(normalization=cfg.normalization)
    attn = layer.submodules.self_attention
    if a.attention == "sdpa":
        attn = dataclasses.replace(attn, submodules=dataclasses.replace(attn.submodules, core_attention=SdpaAttention))
    layer = dataclasses.replace(layer, submodules=dataclasses.replace(
        layer.submodules, input_layernorm=Norm, pre_mlp_layernorm=Norm, self_attention=attn))
    block = TransformerBlockSubmodules(layer_specs=[layer] * s["layers"], layer_norm=Norm)

    rope = dict(position_embedding_type="rope", rotary_base=int(s["rope_theta"]), rope_scaling=True,
                rope_scaling_factor=s["rope_factor"]) if llama else dict(position_embedding_type="learned_absolute")
    model = GPTModel(config=cfg, transformer_layer_spec=block, vocab_size=padded_vocab(s["vocab"], tp),
                     max_sequence_length=a.seq if llama else s["max_positions"], pre_process=True,
                     post_process=True, parallel_output=True, share_embeddings_and_output_weights=True, **rope)
    model.cuda()
    # As Megatron's training loop: Float16Module casts the model to bf16 (the learned position
    # embedding is a plain torch Embedding, fp32 otherwise) and the last stage's output to fp32.
    from megatron.core.transformer.module import Float16Module
    model = Float16Module(cfg, model)
    ddp = DistributedDataParallel(config=cfg, ddp_config=DistributedDataParallelConfig(
        grad_reduce_in_fp32=not a.bf16_grads, overlap_grad_reduce=False, use_distributed_optimizer=False), module=model)
    opt = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=a.lr, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_eps=1e-8,
        bf16=True, params_dtype=torch.bfloat16, use_distributed_optimizer=False, clip_grad=1.0), [ddp])
    return cfg, ddp, opt


def main():
    a = parse_args()
    if a.print_config:
        print(json.dumps({"model": a.model, "seq": a.seq, **a.shape}))
        return
    import torch
    import torch.distributed as dist
    from megatron.core import package_info, parallel_state
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    world, rank = dist.get_world_size(), dist.get_rank()
    tp = a.tp or world
    if world % tp or a.shape["heads"] % tp or a.shape["kv_heads"] % tp:
        sys.exit(f"megatron_anchor: tp {tp} must divide the world ({world}), the heads ({a.shape['heads']}) and the "
                 f"kv heads ({a.shape['kv_heads']}); gpt2-xl at tp 2 needs --heads 20")
    if a.sequence_parallel and a.seq % tp:
        sys.exit(f"megatron_anchor: --seq {a.seq} must divide by tp {tp} with --sequence-parallel")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    model_parallel_cuda_manual_seed(a.seed)
    torch.manual_seed(a.seed)
    dp, dp_rank = world // tp, parallel_state.get_data_parallel_rank()
    cfg, model, opt = build(a, tp)
    n_params = sum(p.numel() for p in model.parameters())  # this rank's slices
    n_params_t = torch.tensor([n_params], device="cuda", dtype=torch.float64)
    dist.all_reduce(n_params_t, group=parallel_state.get_tensor_model_parallel_group())

    g = torch.Generator(device="cuda").manual_seed(1 + dp_rank)  # one replica's data on its tp ranks
    pos = torch.arange(a.seq, device="cuda").unsqueeze(0).expand(a.micro_batch, -1)
    times, losses = [], []
    torch.cuda.reset_peak_memory_stats()
    for step in range(a.warmup + a.steps):
        tokens = torch.randint(0, a.shape["vocab"], (a.micro_batch, a.seq + 1), device="cuda", generator=g)
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.zero_grad_buffer()
        opt.zero_grad()
        loss = model(input_ids=x, position_ids=pos, attention_mask=None, labels=y).float().mean()
        loss.backward()
        finalize_model_grads([model])
        ok, grad_norm, _ = opt.step()
        torch.cuda.synchronize()
        if step >= a.warmup:
            times.append((time.perf_counter() - t0) * 1000)
        losses.append(loss.item())
    peak = torch.tensor([torch.cuda.max_memory_allocated() / GIB], device="cuda")
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    ms = statistics.median(times)
    result = {
        "anchor": f"megatron-core {package_info.__version__} GPTModel (local spec, {a.attention} attention, "
                  "torch norms, Float16Optimizer + torch AdamW, no TE/apex)",
        "model": a.model, "heads": a.shape["heads"], "layers": a.shape["layers"], "tp": tp, "dp": dp,
        "sequence_parallel": a.sequence_parallel, "micro_batch": a.micro_batch, "seq": a.seq,
        "vocab_padded": padded_vocab(a.shape["vocab"], tp), "n_params": int(n_params_t.item()),
        "grad_reduce_in_fp32": not a.bf16_grads, "steps": a.steps, "warmup": a.warmup,
        "ms_per_iter": ms, "ms_all": times, "tokens_per_s": dp * a.micro_batch * a.seq / (ms / 1000),
        "peak_gib": peak.item(), "loss_first": losses[0], "loss_last": losses[-1],
        "grad_norm_last": float(grad_norm) if grad_norm is not None else None, "status": "ok",
    }
    if rank == 0:
        print(json.dumps(result), flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(result, f)
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
