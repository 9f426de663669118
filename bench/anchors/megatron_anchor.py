#!/usr/bin/env python3
"""Megatron-core tensor x pipeline (x data) parallel anchor: GPT-2 XL or the Llama-3.2-3B
shape trained by megatron-core 0.19.2 (pip megatron-core, no Transformer Engine, no apex) at
tp x pp x dp = world size, with and without sequence parallelism -- the counterpart of
`zerotrain train --tp N [--pp M]` (scripts/device/tp_2gpu.sh runs tp 2,
scripts/device/tp_pp_4gpu.sh tp 2 x pp 2 and tp 2 x dp 2; docs/tensor-parallel.md,
docs/pipeline.md).

  groups     parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp,
             pipeline_model_parallel_size=pp) (Megatron's order tp-cp-ep-dp-pp: the tp ranks
             of a stage are neighbours), dp = world / (tp x pp)
  pipeline   one GPTModel per stage (pre_process on the first stage: embeddings;
             post_process on the last: final norm, tied head, loss; the stage's
             num_layers / pp layers), the head tied to the first stage's word embedding
             through Megatron's embedding group (copied at construction, gradients summed
             in finalize_model_grads); each step is
             schedules.get_forward_backward_func() over --micro-batches M micro-batches:
             1F1B (forward_backward_pipelining_without_interleaving) at pp > 1, Megatron's
             no-pipelining gradient accumulation at pp 1; activations cross stages in bf16
             (pipeline_dtype), deallocate_pipeline_outputs on (as Megatron-LM's training);
             stage s seeds its weights with seed + 100 s (Megatron-LM's convention)

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
  data       random tokens, M micro-batches per step, the same on every tp and pp rank of
             a replica (seed 1 + dp rank): the first stage reads the inputs, the last the
             labels
  step       zero_grad_buffer, the schedule's M forwards and backwards (labels -> per-token
             loss, mean, / M), finalize_model_grads (dp all-reduce; sequence-parallel norm
             gradients over tp; tied embedding gradients between first and last stage),
             optimizer.step
  timing     --warmup steps, then --steps timed steps, each between cuda synchronizes;
             ms_per_iter = the largest over the ranks of each rank's median
             (ms_per_iter_per_rank); tokens_per_s = the global batch's tokens, dp x M x
             micro_batch x seq, / (ms / 1000) (each replica's tokens once); MFU =
             flops_per_token x tokens_per_s / world / --peak-tflops, flops_per_token by
             zerotrain's formulas (gpt2: 6 N + 12 L C seq, N without the position table;
             llama: 6 N + 12 L heads head_dim seq) so that the two MFUs compare; peak_gib =
             max over ranks of torch.cuda.max_memory_allocated over the whole run,
             peak_gib_per_rank (world rank order) and peak_gib_per_stage (max over a stage's
             ranks); activation_gib (pp 1 only) = rank 0's memory allocated when a micro-batch's
             forward reaches the loss minus at the step's start (what forward holds for
             backward, as zerotrain's phase_mem_gib forward.after - step.after); loss = the mean over the micro-batches of the last stage, then over the
             dp replicas

Run (2 GPUs, tp 2), from the repository root, after installing the wheel (scripts/device/tp_2gpu.sh):
  CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc_per_node 2 bench/anchors/megatron_anchor.py \\
      --model gpt2-xl --heads 20 --micro-batch 4 [--sequence-parallel] --out result.json
4 GPUs, tp 2 x pp 2, 8 micro-batches of 4 (scripts/device/tp_pp_4gpu.sh); --pp 1 gives tp 2 x dp 2:
  CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc_per_node 4 bench/anchors/megatron_anchor.py \\
      --model gpt2-xl --heads 20 --tp 2 --pp 2 --micro-batch 4 --micro-batches 8 --out result.json
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
    p.add_argument("--tp", type=int, default=0, help="tensor-parallel size (default: the world size / pp)")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (dp = world / (tp x pp))")
    p.add_argument("--micro-batches", type=int, default=1,
                   help="micro-batches per step and replica (1F1B at pp > 1, gradient accumulation at pp 1)")
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=0, help="default: the shape's (1024 / 2048)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--attention", choices=["sdpa", "local"], default="sdpa")
    p.add_argument("--bf16-grads", action="store_true", help="reduce gradients in bf16 (default fp32)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="MFU denominator per GPU (989: H100 SXM / H200 dense bf16)")
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
    if a.pp < 1 or a.micro_batches < 1 or a.tp < 0:
        p.error("--pp and --micro-batches must be at least 1, --tp at least 0 (0: the world size / pp)")
    if s["layers"] % a.pp:
        p.error(f"--pp {a.pp} must divide the {s['layers']} layers (Megatron builds layers / pp per stage)")
    a.shape = s
    return a


def padded_vocab(vocab, tp, multiple=128):
    """Megatron-LM's _vocab_size_with_padding: up to a multiple of multiple x tp."""
    m = multiple * tp
    return (vocab + m - 1) // m * m


def flops_per_token(s, seq):
    """Training FLOPs per token by zerotrain's formulas (src/models/gpt2.cpp
    gpt2_flops_per_token, src/models/llama_config.cpp llama_flops_per_token): 6 N + 12 L x
    attention width x seq; GPT-2's N leaves out the position table, the tied table counts
    once."""
    L, C, V, F = s["layers"], s["hidden"], s["vocab"], s["ffn"]
    if s["family"] == "gpt2":
        n = V * C + L * (12 * C * C + 13 * C) + 2 * C  # without wpe (nanoGPT's N)
        return 6 * n + 12 * L * C * seq
    d_head = C // s["heads"]
    q, kv = s["heads"] * d_head, s["kv_heads"] * d_head
    per_layer = C * q + 2 * C * kv + q * C + 3 * C * F + 2 * C  # q, k, v, o, SwiGLU, 2 RMSNorms
    n = V * C + L * per_layer + C  # tied embedding once, final norm
    return 6 * n + 12 * L * q * seq


def build(a, tp, pp):
    """This pipeline stage's GPTModel of the shape, wrapped in Megatron's DDP (its gradient
    buffers feed the optimizer's main_grad), and its optimizer; the config carries the hooks
    the schedule calls (finalize_model_grads, the loss scale, DDP's no_sync)."""
    import dataclasses

    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
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
        # The pipeline: stage outputs cross in bf16; the stage's output tensor is freed after
        # it is sent, only its autograd graph kept (Megatron-LM's training sets this too).
        pipeline_model_parallel_size=pp, pipeline_dtype=torch.bfloat16, deallocate_pipeline_outputs=True,
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
    # A TransformerBlockSubmodules is built as given, so it lists this stage's layers only
    # (num_layers / pp); the final norm is built on the last stage (post_process) only.
    block = TransformerBlockSubmodules(layer_specs=[layer] * get_num_layers_to_build(cfg), layer_norm=Norm)
    first, last = parallel_state.is_pipeline_first_stage(), parallel_state.is_pipeline_last_stage()

    rope = dict(position_embedding_type="rope", rotary_base=int(s["rope_theta"]), rope_scaling=True,
                rope_scaling_factor=s["rope_factor"]) if llama else dict(position_embedding_type="learned_absolute")
    model = GPTModel(config=cfg, transformer_layer_spec=block, vocab_size=padded_vocab(s["vocab"], tp),
                     max_sequence_length=a.seq if llama else s["max_positions"], pre_process=first,
                     post_process=last, parallel_output=True, share_embeddings_and_output_weights=True, **rope)
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
    # As Megatron-LM's train(): the schedule finalizes the gradients after the last backward,
    # scales the last stage's loss by the optimizer's (bf16: 1) and holds DDP's sync until then.
    cfg.finalize_model_grads_func = finalize_model_grads
    cfg.grad_scale_func = opt.scale_loss
    cfg.no_sync_func = ddp.no_sync
    return cfg, ddp, opt


def main():
    a = parse_args()
    if a.print_config:
        print(json.dumps({"model": a.model, "seq": a.seq, "pp": a.pp, "micro_batches": a.micro_batches, **a.shape}))
        return
    import torch
    import torch.distributed as dist
    from megatron.core import package_info, parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed, param_is_not_tensor_parallel_duplicate

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    world, rank = dist.get_world_size(), dist.get_rank()
    pp = a.pp
    if world % pp:
        sys.exit(f"megatron_anchor: --pp {pp} must divide the world ({world})")
    tp = a.tp or world // pp
    if world % (tp * pp) or a.shape["heads"] % tp or a.shape["kv_heads"] % tp:
        sys.exit(f"megatron_anchor: tp {tp} x pp {pp} must divide the world ({world}), tp the heads "
                 f"({a.shape['heads']}) and the kv heads ({a.shape['kv_heads']}); gpt2-xl at tp 2 needs --heads 20")
    if a.sequence_parallel and a.seq % tp:
        sys.exit(f"megatron_anchor: --seq {a.seq} must divide by tp {tp} with --sequence-parallel")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    pp_rank, tp_rank = parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_tensor_model_parallel_rank()
    first, last = parallel_state.is_pipeline_first_stage(), parallel_state.is_pipeline_last_stage()
    # Megatron-LM's _set_random_seed: each stage its own stream, so its layers differ.
    model_parallel_cuda_manual_seed(a.seed + 100 * pp_rank)
    torch.manual_seed(a.seed + 100 * pp_rank)
    dp, dp_rank = world // (tp * pp), parallel_state.get_data_parallel_rank()
    cfg, model, opt = build(a, tp, pp)
    # The whole model's parameters, each once (the vocabulary padded): this rank's tp slices,
    # the tp-replicated ones (norms, row-parallel biases, the position table) on tp rank 0
    # only, and the last stage's copy of the tied embedding (marked `shared`) not at all.
    n_params = sum(p.numel() for p in model.parameters()
                   if not getattr(p, "shared", False) and param_is_not_tensor_parallel_duplicate(p))
    n_params_t = torch.tensor([n_params], device="cuda", dtype=torch.float64)
    dist.all_reduce(n_params_t, group=parallel_state.get_model_parallel_group())  # tp x pp
    forward_backward = get_forward_backward_func()
    M = a.micro_batches

    g = torch.Generator(device="cuda").manual_seed(1 + dp_rank)  # one replica's data on its tp and pp ranks
    pos = torch.arange(a.seq, device="cuda").unsqueeze(0).expand(a.micro_batch, -1)

    def forward_step(data_iterator, model):
        x, y = next(data_iterator)  # the first stage reads x, the last y; the others neither

        def loss_func(per_token):  # last stage: (b, s) fp32 losses -> mean; the schedule divides by M
            # Memory when a micro-batch's forward has ended (its activations held for backward).
            at_loss.append(torch.cuda.memory_allocated())
            loss = per_token.float().mean()
            return loss, {"lm loss": loss.detach().clone()}

        return model(input_ids=x, position_ids=pos, attention_mask=None, labels=y), loss_func

    times, losses = [], []
    at_loss, act_bytes = [], []  # activation memory per step: max at a loss - at the step's start (pp 1)
    torch.cuda.reset_peak_memory_stats()
    for step in range(a.warmup + a.steps):
        batch = []
        for _ in range(M):
            tokens = torch.randint(0, a.shape["vocab"], (a.micro_batch, a.seq + 1), device="cuda", generator=g)
            batch.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.zero_grad_buffer()
        opt.zero_grad()
        at_loss.clear()
        start_alloc = torch.cuda.memory_allocated()
        out = forward_backward(forward_step_func=forward_step, data_iterator=iter(batch), model=[model],
                               num_microbatches=M, seq_length=a.seq, micro_batch_size=a.micro_batch,
                               forward_only=False)
        if at_loss:
            act_bytes.append(max(at_loss) - start_alloc)
        ok, grad_norm, _ = opt.step()
        torch.cuda.synchronize()
        if step >= a.warmup:
            times.append((time.perf_counter() - t0) * 1000)
        # The step's loss: mean over the micro-batches on the last stage, then over the dp
        # replicas (the tp ranks of a replica's last stage hold the same value).
        mine = sum(float(d["lm loss"]) for d in out) / M if last else 0.0
        lt = torch.tensor([mine], device="cuda", dtype=torch.float64)
        dist.all_reduce(lt)
        losses.append(lt.item() / (tp * dp))
    ms_rank = statistics.median(times)
    act_gib = max(act_bytes[a.warmup:] or act_bytes or [0]) / GIB if pp == 1 else None
    mine = torch.tensor([torch.cuda.max_memory_allocated() / GIB, ms_rank, pp_rank, tp_rank, dp_rank],
                        device="cuda", dtype=torch.float64)
    every = torch.empty(world * mine.numel(), device="cuda", dtype=torch.float64)
    dist.all_gather_into_tensor(every, mine)
    rows = every.view(world, -1).tolist()
    peak_per_rank = [r[0] for r in rows]
    ms_per_rank = [r[1] for r in rows]
    peak_per_stage = [max(r[0] for r in rows if int(r[2]) == s) for s in range(pp)]
    ms = max(ms_per_rank)
    tokens_step = dp * M * a.micro_batch * a.seq
    tokens_per_s = tokens_step / (ms / 1000)
    fpt = flops_per_token(a.shape, a.seq)
    tflops = fpt * tokens_per_s / world / 1e12
    result = {
        "anchor": f"megatron-core {package_info.__version__} GPTModel (local spec, {a.attention} attention, "
                  "torch norms, Float16Optimizer + torch AdamW, no TE/apex)",
        "model": a.model, "heads": a.shape["heads"], "layers": a.shape["layers"], "world": world,
        "tp": tp, "pp": pp, "dp": dp, "micro_batches": M,
        "schedule": "1F1B (forward_backward_pipelining_without_interleaving)" if pp > 1 else
                    "forward_backward_no_pipelining",
        "sequence_parallel": a.sequence_parallel, "micro_batch": a.micro_batch, "seq": a.seq,
        "vocab_padded": padded_vocab(a.shape["vocab"], tp), "n_params": int(n_params_t.item()),
        "grad_reduce_in_fp32": not a.bf16_grads, "steps": a.steps, "warmup": a.warmup,
        "ms_per_iter": ms, "ms_per_iter_per_rank": ms_per_rank, "ms_all": times,
        "tokens_per_iter": tokens_step, "tokens_per_s": tokens_per_s,
        "flops_per_token": fpt, "tflops_per_gpu": tflops, "peak_tflops": a.peak_tflops, "mfu": tflops / a.peak_tflops,
        "peak_gib": max(peak_per_rank), "peak_gib_per_rank": peak_per_rank, "peak_gib_per_stage": peak_per_stage,
        "activation_gib": act_gib,
        "loss_first": losses[0], "loss_last": losses[-1], "losses": losses,
        "grad_norm_last": float(grad_norm) if grad_norm is not None else None, "status": "ok",
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
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
