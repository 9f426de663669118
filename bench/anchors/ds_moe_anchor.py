#!/usr/bin/env python3
"""DeepSpeed-MoE anchor: a GPT-2 whose every other block's MLP is deepspeed.moe.layer.MoE, trained
by deepspeed.initialize on several processes with its experts split over ep ranks -- the
counterpart of `zerotrain train --ep N --moe-experts E` (scripts/device/moe_2gpu.sh runs both;
docs/moe.md). The same math as zerotrain's MoE GPT-2 ([GPT-2 MoE] in src/models/gpt2.h):

  model      bench/anchors/gpt2.py's GPT-2 (pre-LN, fused c_attn, SDPA causal attention, tanh
             GELU, tied head, LayerNorm eps 1e-5, GPT-2 init); blocks moe_every-1,
             2*moe_every-1, ... (--moe-every, default 2: the odd ones) replace the MLP by
             MoE(hidden, expert=GPT-2's MLP (c_fc C->4C, GELU tanh, c_proj 4C->C),
             num_experts=E, ep_size=--ep, k, capacity_factor, eval_capacity_factor (the same),
             min_capacity=4, drop_tokens, use_rts=False, noisy_gate_policy=None,
             top2_2nd_expert_sampling=False): zerotrain's GPT-2 MoE draws nothing either, so the
             routing is argmax / masked argmax as there. Every expert and the gate are
             initialised as zerotrain's (expert c_fc/c_proj as GPT-2's MLP, c_proj at
             0.02/sqrt(2L); gate N(0, 0.02), no bias), each expert from its own seed (DeepSpeed's
             Experts deep-copies one module, so its experts would start equal).
  loss       cross entropy (fp32 logits, mean over B*T) + --aux-coef (0.01) x the sum of the MoE
             blocks' l_aux, as zerotrain's loss(); DeepSpeed's l_aux is zerotrain's aux loss
             (E * sum_e me_e ce_e, first choices before drops).
  capacity   drop_tokens: C = max(ceil(T/E * f), 4), f = capacity_factor (x2 for top-2, inside
             DeepSpeed as in zerotrain); dropless (no --drop-tokens): C = the most assignments to
             any expert, all-reduced (max) over the ep group.
  training   deepspeed.initialize: bf16 (bf16 parameters, fp32 master), ZeRO --stage (1 or 2;
             DeepSpeed refuses MoE at stage 3) with reduce_bucket_size 5e7, allgather_bucket_size
             2e8, overlap_comm (as zerotrain's bench/configs/gpt2_bf16_z{1,2}.json), its AdamW
             (FusedAdam; lr 1e-4, betas 0.9/0.999, eps 1e-8, wd 0), clip 1.0, the parameters split
             with deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer (the
             experts' own group, reduced over expert-dp), DeepSpeed's E + D rank layout.
  data       random tokens, (micro, seq + 1) per rank per step (seed + rank): x = [:, :-1], y = [:, 1:]
  timing     --warmup steps, then --steps timed steps, each ended by a cuda synchronize:
             ms_per_iter = the median (max over ranks); tokens_per_s = world x micro x seq /
             (ms / 1000) (each data-parallel replica's tokens once; dp = world under E + D);
             peak_gib = max over ranks of torch.cuda.max_memory_allocated over the run.
  routing    rank 0's tokens, its last timed step: aux_loss (unscaled sum over the MoE blocks),
             tokens_per_expert (kept assignments summed over the MoE blocks: min(routed_e, C),
             since a top-2 second choice takes the slots after every first choice, as in
             zerotrain), dropped_fraction (mean over the timed steps); all_to_all_ms: the MoE
             all-to-alls of a step, forward and backward, each between two CUDA events on the
             current stream (DeepSpeed's _AllToAll wrapped; the same measure as zerotrain's
             --moe-timing), mean over the timed steps; --no-a2a-timing leaves it out.

--arch mixtral --hf-config CONFIG.json: the counterpart of `zerotrain train --model CONFIG.json --ep N`
for a Hugging Face MixtralForCausalLM config ([Mixtral] in src/models/llama.h; the config sets the
shape, the experts, k and the aux coef, overriding --layers/--embd/--heads/--vocab/--experts/--k/
--moe-every/--aux-coef; scripts/device/moe_mixtral_2gpu.sh runs both):
  model      HF Mixtral's decoder: embed_tokens, per layer RMSNorm (fp32 statistics, eps
             rms_norm_eps) -> attention (q/k/v/o_proj, no bias, RoPE theta rope_theta in HF's
             rotate_half layout, GQA through SDPA's enable_gqa, causal) -> RMSNorm -> MoE, final
             RMSNorm, an untied lm_head. Every layer's MLP is MoE(hidden, expert=Mixtral's SwiGLU
             expert w2(silu(w1 x) * w3 x), num_experts=num_local_experts, k=num_experts_per_tok
             (1 or 2), the same capacity / dropless / min_capacity options and no noise, RTS or
             sampled second expert as above). Init: every Linear and the embedding N(0,
             initializer_range), norms 1, each expert from its own seed (as above), built on the
             device. Checked: at ep 1, dropless, fp32, its loss equals transformers'
             MixtralForCausalLM's on the same weights (bench/anchors/check_ds_moe_mixtral.py).
  routing    DeepSpeed's top2gating: first = argmax softmax(logits), second = argmax of the logits
             with the first masked, weights = the kept choices' probabilities over their sum --
             HF Mixtral's topk(softmax) and renormalization when nothing drops (dropless, or under
             capacity). Where they differ: with --drop-tokens DeepSpeed drops past C = ceil(T/E x
             2f) (first choices fill the slots first) and renormalizes over the kept choices (a
             token whose second choice dropped gets weight 1 on its first); HF never drops. The
             aux loss: DeepSpeed's l_aux per layer is E * sum_e me_e ce_e with ce from the first
             choices only; HF's load_balancing_loss_func (zerotrain's moe_aux_loss) counts every
             choice (sum over j of ce[j, e]) over all layers' tokens concatenated, so balanced it
             is k, not 1. Here loss = CE + router_aux_loss_coef (if output_router_logits, else 0)
             x the mean over layers of l_aux; aux_loss reports that mean, unscaled.
  the rest   as above (bf16, ZeRO --stage 1/2 with the same buckets, AdamW, clip, E + D, data,
             timing, the routing counters and all_to_all_ms); the JSON line adds arch, hf_config,
             kv_heads and intermediate.

Run (2 GPUs, ep 2), from the repository root, after installing the DeepSpeed wheel (.whl/):
  torchrun --nproc_per_node 2 bench/anchors/ds_moe_anchor.py --layers 24 --embd 1024 --heads 16 \\
      --seq 1024 --micro 4 --experts 8 --k 2 --ep 2 --capacity-factor 1.0 --drop-tokens --stage 2 --out r.json
  torchrun --nproc_per_node 2 bench/anchors/ds_moe_anchor.py --arch mixtral \\
      --hf-config bench/configs/models/mixtral-2gpu.json --seq 1024 --micro 2 --ep 2 --stage 2 --out r.json
Rank 0 prints one JSON line and writes it to --out. `--device cpu` (gloo, fp32, torch AdamW) is a
smoke test on CPU ranks (DS_ACCELERATOR=cpu).
"""
import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ds_env import torch_cuda_arch_for_deepspeed  # noqa: E402
from gpt2 import MLP, CausalSelfAttention, GPTConfig, cross_entropy_loss, init_gpt2_module  # noqa: E402

GIB = 2**30


class A2ATimes:
    """The all-to-alls of the MoE layers, each as (start, end) CUDA events (CPU: host times)."""

    def __init__(self):
        self.on, self.spans = False, []

    def take_ms(self):
        ms = 0.0
        for s, e in self.spans:
            ms += s.elapsed_time(e) if isinstance(s, torch.cuda.Event) else (e - s) * 1e3
        self.spans = []
        return ms


A2A = A2ATimes()


def timed_all_to_all(group, x):
    """DeepSpeed's _AllToAll.forward (all_to_all_single of equal chunks), between two events."""
    import torch.distributed as dist
    x = x.contiguous()
    out = torch.empty_like(x)
    if not A2A.on:
        dist.all_to_all_single(out, x, group=group)
        return out
    if x.is_cuda:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dist.all_to_all_single(out, x, group=group)  # the current stream waits for it
        e.record()
        A2A.spans.append((s, e))
    else:
        t0 = time.perf_counter()
        dist.all_to_all_single(out, x, group=group)
        A2A.spans.append((t0, time.perf_counter()))
    return out


class TimedAllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        return timed_all_to_all(group, x)

    @staticmethod
    def backward(ctx, *grad):
        return None, TimedAllToAll.apply(ctx.group, *grad)


class MoEBlock(nn.Module):
    """GPT-2's block with its MLP replaced by DeepSpeed's MoE of GPT-2 MLPs."""

    def __init__(self, cfg, a, layer):
        super().__init__()
        from deepspeed.moe.layer import MoE
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.moe = MoE(hidden_size=cfg.n_embd, expert=MLP(cfg), num_experts=a.experts, ep_size=a.ep, k=a.k,
                       capacity_factor=a.capacity_factor, eval_capacity_factor=a.capacity_factor,
                       min_capacity=a.min_capacity, use_residual=False, noisy_gate_policy=None,
                       drop_tokens=a.drop_tokens, use_rts=False, top2_2nd_expert_sampling=False)
        self.layer = layer
        self.l_aux = None

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        y, self.l_aux, self.exp_counts = self.moe(self.ln_2(x))
        return x + y


class DenseBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class MoEGPT2(nn.Module):
    def __init__(self, cfg, a, ep_rank):
        super().__init__()
        self.cfg, self.aux_coef = cfg, a.aux_coef
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList([MoEBlock(cfg, a, i) if (i + 1) % a.moe_every == 0 else DenseBlock(cfg)
                                for i in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.reset_parameters(a.seed, ep_rank)

    def moe_blocks(self):
        return [b for b in self.h if isinstance(b, MoEBlock)]

    @torch.no_grad()
    def reset_parameters(self, seed, ep_rank):
        std, proj_std = 0.02, 0.02 / math.sqrt(2 * self.cfg.n_layer)
        torch.manual_seed(seed)
        for name, m in self.named_modules():
            if ".deepspeed_experts." in name:
                continue  # below, each expert from its own seed
            init_gpt2_module(name, m, std, proj_std)  # the gate is a Linear without bias
        for b in self.moe_blocks():
            experts = b.moe.deepspeed_moe.experts.deepspeed_experts
            for i, ex in enumerate(experts):
                g = torch.Generator().manual_seed(seed + 1000 * (b.layer + 1) + ep_rank * len(experts) + i)
                for lin, s in ((ex.c_fc, std), (ex.c_proj, proj_std)):
                    lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * s)
                    lin.bias.zero_()

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for blk in self.h:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        lm = cross_entropy_loss(logits, targets)
        aux = sum(b.l_aux for b in self.moe_blocks())
        self.last_aux = aux.detach()
        return lm + self.aux_coef * aux


class RMSNorm(nn.Module):
    """Llama's RMSNorm: x * rsqrt(mean(x^2) + eps) in fp32, cast back, times the weight (ones)."""

    def __init__(self, d, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_cos_sin(seq, head_dim, theta, device):
    """HF Llama's default RoPE (rotate_half layout): cos/sin [seq, head_dim] in fp32."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    f = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv)
    emb = torch.cat((f, f), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):  # x [B, H, T, hd]
    x1, x2 = x[..., : x.size(-1) // 2], x[..., x.size(-1) // 2:]
    rot = torch.cat((-x2, x1), dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


class LlamaAttention(nn.Module):
    """q/k/v/o_proj without bias, RoPE, GQA through SDPA's enable_gqa, causal."""

    def __init__(self, h):
        super().__init__()
        d, self.nh, self.nkv = h["hidden_size"], h["num_attention_heads"], h["num_key_value_heads"]
        self.hd = h.get("head_dim") or d // self.nh
        self.q_proj = nn.Linear(d, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.nkv != self.nh)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MixtralExpert(nn.Module):
    """Mixtral's expert (HF MixtralBlockSparseTop2MLP): w2(silu(w1 x) * w3 x), no bias."""

    def __init__(self, h):
        super().__init__()
        d, ff = h["hidden_size"], h["intermediate_size"]
        self.w1 = nn.Linear(d, ff, bias=False)
        self.w2 = nn.Linear(ff, d, bias=False)
        self.w3 = nn.Linear(d, ff, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MixtralBlock(nn.Module):
    """A Mixtral decoder layer: RMSNorm, attention, RMSNorm, DeepSpeed's MoE of Mixtral experts."""

    def __init__(self, h, a, layer):
        super().__init__()
        from deepspeed.moe.layer import MoE
        eps = h.get("rms_norm_eps", 1e-5)
        self.input_layernorm = RMSNorm(h["hidden_size"], eps)
        self.self_attn = LlamaAttention(h)
        self.post_attention_layernorm = RMSNorm(h["hidden_size"], eps)
        self.moe = MoE(hidden_size=h["hidden_size"], expert=MixtralExpert(h), num_experts=a.experts, ep_size=a.ep,
                       k=a.k, capacity_factor=a.capacity_factor, eval_capacity_factor=a.capacity_factor,
                       min_capacity=a.min_capacity, use_residual=False, noisy_gate_policy=None,
                       drop_tokens=a.drop_tokens, use_rts=False, top2_2nd_expert_sampling=False)
        self.layer = layer
        self.l_aux = None

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        y, self.l_aux, self.exp_counts = self.moe(self.post_attention_layernorm(x))
        return x + y


class MoEMixtral(nn.Module):
    """--arch mixtral: HF MixtralForCausalLM's shape from --hf-config, every layer's MLP DeepSpeed's MoE."""

    def __init__(self, h, a, ep_rank):
        super().__init__()
        self.h_cfg, self.aux_coef = h, a.aux_coef
        d = h["hidden_size"]
        self.theta = float(h.get("rope_theta") or (h.get("rope_parameters") or {}).get("rope_theta", 1e6))
        self.embed_tokens = nn.Embedding(h["vocab_size"], d)
        self.layers = nn.ModuleList([MixtralBlock(h, a, i) for i in range(h["num_hidden_layers"])])
        self.norm = RMSNorm(d, h.get("rms_norm_eps", 1e-5))
        self.lm_head = nn.Linear(d, h["vocab_size"], bias=False)  # untied
        self.reset_parameters(a.seed, ep_rank, h.get("initializer_range", 0.02))

    def moe_blocks(self):
        return list(self.layers)

    @torch.no_grad()
    def reset_parameters(self, seed, ep_rank, std):
        torch.manual_seed(seed)
        for name, m in self.named_modules():
            if ".deepspeed_experts." in name:
                continue  # below, each expert from its own seed
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.normal_(0.0, std)  # the gate is a Linear without bias
        for b in self.layers:
            experts = b.moe.deepspeed_moe.experts.deepspeed_experts
            for i, ex in enumerate(experts):
                dev = ex.w1.weight.device
                g = torch.Generator(device=dev).manual_seed(seed + 1000 * (b.layer + 1) + ep_rank * len(experts) + i)
                for lin in (ex.w1, ex.w2, ex.w3):
                    lin.weight.copy_(torch.randn(lin.weight.shape, generator=g, device=dev) * std)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.embed_tokens(idx)
        cos, sin = rope_cos_sin(T, self.layers[0].self_attn.hd, self.theta, idx.device)
        for blk in self.layers:
            x = blk(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        lm = cross_entropy_loss(logits, targets)
        aux = sum(b.l_aux for b in self.layers) / len(self.layers)
        self.last_aux = aux.detach()
        return lm + self.aux_coef * aux


def ds_config(a):
    params = {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    if a.device == "cpu":
        params.update(torch_adam=True, adam_w_mode=True)  # FusedAdam needs CUDA
    return {
        "train_micro_batch_size_per_gpu": a.micro,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 1 << 30,
        "bf16": {"enabled": a.device == "cuda"},
        "optimizer": {"type": "AdamW", "params": params},
        "zero_optimization": {"stage": a.stage, "reduce_bucket_size": 5e7, "allgather_bucket_size": 2e8,
                              "overlap_comm": a.overlap_comm},
        "wall_clock_breakdown": False,
    }


def kept_and_dropped(model, a, tokens):
    """Per MoE block: kept assignments per expert (min(routed_e, C)) and the dropped fraction."""
    kept_rows, dropped = [], []
    for b in model.moe_blocks():
        routed = b.exp_counts.detach().to("cpu", torch.long)
        if a.drop_tokens:
            f = a.capacity_factor * (2 if a.k == 2 else 1)
            cap = max(math.ceil(tokens / a.experts * f), a.min_capacity)
            kept = torch.minimum(routed, torch.tensor(cap))
        else:
            kept = routed
        kept_rows.append(kept.tolist())
        dropped.append(1.0 - kept.sum().item() / max(1, routed.sum().item()))
    return kept_rows, sum(dropped) / max(1, len(dropped))


def run(a, out):
    import deepspeed
    import torch.distributed as dist
    from deepspeed.moe import sharded_moe
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    out["deepspeed"] = deepspeed.__version__
    world, rank = dist.get_world_size(), dist.get_rank()
    if a.experts % a.ep or world % a.ep:
        raise SystemExit(f"--experts {a.experts} and the world {world} must divide by --ep {a.ep}")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if a.device == "cuda" else torch.device("cpu")
    sharded_moe._AllToAll = TimedAllToAll  # MOELayer.forward looks the name up at each call
    A2A.on = a.a2a_timing
    if a.arch == "mixtral":
        with torch.device(device):  # built and initialised on the device: billions of parameters
            model = MoEMixtral(a.hf, a, ep_rank=rank % a.ep)  # E + D: the ep groups are consecutive ranks
    else:
        cfg = GPTConfig("moe", n_layer=a.layers, n_head=a.heads, n_embd=a.embd, vocab_size=a.vocab,
                        n_positions=max(1024, a.seq), seq=a.seq)
        model = MoEGPT2(cfg, a, ep_rank=rank % a.ep)  # E + D: the ep groups are consecutive ranks
    n_local = sum(p.numel() for p in model.parameters())
    groups = split_params_into_different_moe_groups_for_optimizer(
        [{"params": [p for p in model.parameters()], "name": "parameters"}])
    t_build = time.perf_counter()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=ds_config(a))
    out["build_s"] = time.perf_counter() - t_build
    out["optimizer"] = f"{type(engine.optimizer).__name__}({type(engine.basic_optimizer).__name__})"
    expert_numel = sum(p.numel() for n, p in model.named_parameters() if ".deepspeed_experts." in n)
    out["n_params"] = n_local - expert_numel + expert_numel * a.ep  # every expert once
    out["moe_blocks"] = len(model.moe_blocks())

    g = torch.Generator(device="cpu").manual_seed(a.seed + rank)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, losses, dropped, a2a = [], [], [], []
    kept = aux = None
    for s in range(a.warmup + a.steps):
        tok = torch.randint(0, a.vocab, (a.micro, a.seq + 1), generator=g).to(device)
        x, y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()
        sync()
        t0 = time.perf_counter()
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        sync()
        dt = (time.perf_counter() - t0) * 1e3
        losses.append(loss.item())
        step_a2a = A2A.take_ms()
        if s >= a.warmup:
            times.append(dt)
            a2a.append(step_a2a)
            kept, d = kept_and_dropped(model, a, a.micro * a.seq)
            dropped.append(d)
            aux = model.last_aux.float().item()
    med = torch.tensor([statistics.median(times), statistics.mean(a2a)], dtype=torch.float64, device=device)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    ms = med[0].item()
    peak = torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else 0.0
    peaks = [None] * world
    dist.all_gather_object(peaks, peak)
    per_expert = [sum(col) for col in zip(*kept)] if kept else []
    out.update(ms_per_iter=ms, tokens_per_s=world * a.micro * a.seq / (ms / 1e3), peak_gib=max(peaks),
               peak_gib_per_rank=peaks, loss_first=losses[0], loss=losses[-1], loss_last=losses[-1],
               losses=losses, aux_loss=aux, dropped_fraction=statistics.mean(dropped),
               tokens_per_expert=per_expert, tokens_per_expert_by_layer=kept,
               all_to_all_ms=statistics.mean(a2a) if a.a2a_timing else None,
               all_to_all_ms_max_rank=med[1].item() if a.a2a_timing else None,
               device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               torch=torch.__version__)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=("gpt2", "mixtral"), default="gpt2",
                   help="mixtral: the Llama MoE of --hf-config (its sizes, experts and aux coef override "
                        "--layers/--embd/--heads/--vocab/--experts/--k/--moe-every/--aux-coef)")
    p.add_argument("--hf-config", default="", help="--arch mixtral: a MixtralForCausalLM config.json")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--embd", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--micro", type=int, default=4, help="micro-batch per rank")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--k", type=int, default=2, choices=(1, 2))
    p.add_argument("--ep", type=int, default=2)
    p.add_argument("--moe-every", type=int, default=2, help="blocks every-1, 2*every-1, ... are MoE")
    p.add_argument("--capacity-factor", type=float, default=1.0)
    p.add_argument("--drop-tokens", action="store_true", help="drop beyond capacity (default: dropless)")
    p.add_argument("--min-capacity", type=int, default=4)
    p.add_argument("--aux-coef", type=float, default=0.01)
    p.add_argument("--stage", type=int, default=2, choices=(0, 1, 2))
    p.add_argument("--overlap-comm", type=int, default=1, choices=(0, 1))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--no-a2a-timing", dest="a2a_timing", action="store_false")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: smoke test (gloo, fp32)")
    p.add_argument("--out", default="")
    a = p.parse_args()
    a.overlap_comm = bool(a.overlap_comm)
    if a.steps < 1:
        p.error("--steps must be >= 1")
    if a.arch == "mixtral":
        if not a.hf_config:
            p.error("--arch mixtral needs --hf-config PATH (a MixtralForCausalLM config.json)")
        with open(a.hf_config) as f:
            a.hf = json.load(f)
        if a.hf.get("tie_word_embeddings"):
            p.error(f"{a.hf_config}: tie_word_embeddings is true; the Mixtral anchor has an untied lm_head")
        a.layers, a.embd, a.heads = a.hf["num_hidden_layers"], a.hf["hidden_size"], a.hf["num_attention_heads"]
        a.vocab, a.experts, a.k = a.hf["vocab_size"], a.hf.get("num_local_experts", 8), a.hf.get("num_experts_per_tok", 2)
        if a.k not in (1, 2):
            p.error(f"{a.hf_config}: num_experts_per_tok {a.k}: DeepSpeed's gate is top-1 or top-2")
        a.moe_every = 1
        a.aux_coef = a.hf.get("router_aux_loss_coef", 0.001) if a.hf.get("output_router_logits", False) else 0.0

    rank = int(os.environ.get("RANK", 0))
    out = {"anchor": f"DeepSpeed-MoE ZeRO-{a.stage}", "layers": a.layers, "embd": a.embd, "heads": a.heads,
           "vocab": a.vocab, "seq": a.seq, "micro_batch": a.micro, "experts": a.experts, "k": a.k, "ep": a.ep,
           "moe_every": a.moe_every, "capacity_factor": a.capacity_factor, "drop_tokens": a.drop_tokens,
           "min_capacity": a.min_capacity, "aux_coef": a.aux_coef, "stage": a.stage, "overlap_comm": a.overlap_comm,
           "steps": a.steps, "warmup": a.warmup, "dtype": "bf16" if a.device == "cuda" else "fp32",
           "world": int(os.environ.get("WORLD_SIZE", 1))}
    if a.arch == "mixtral":
        out.update(arch="mixtral", hf_config=a.hf_config, kv_heads=a.hf["num_key_value_heads"],
                   intermediate=a.hf["intermediate_size"])
    try:
        if a.device == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        else:
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(dev)
            torch_cuda_arch_for_deepspeed(dev)
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo" if a.device == "cpu" else "nccl")
        run(a, out)
        out["status"] = "ok"
    except BaseException as e:  # noqa: BLE001  (SystemExit included: one JSON line either way)
        traceback.print_exc()
        out.update(status="error", error=f"{type(e).__name__}: {e}")
    if rank == 0:
        line = json.dumps(out, default=str)
        if a.out:
            with open(a.out, "w") as f:
                f.write(line + "\n")
        print(line, flush=True)
    if out["status"] != "ok":
        sys.stdout.flush()
        os._exit(1)  # a peer may be stuck in a collective: do not wait for the process group
    import torch.distributed as dist
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
