"""Plain-PyTorch GPT-2 with the same shapes and math as zerotrain's C++ GPT-2.

Model (per block, pre-LN):
    x = x + c_proj(SDPA_causal(split_heads(c_attn(ln_1(x)))))       c_attn: C -> 3C (fused q,k,v)
    x = x + mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x))))                  c_fc:   C -> 4C
  input  = wte[idx] + wpe[0..T)
  output = ln_f(x) @ wte.T            (tied LM head, no separate weight)
  loss   = cross_entropy(logits.float(), targets)   (mean over all B*T tokens)

All Linear layers and LayerNorms have biases (as GPT-2); LayerNorm eps = 1e-5; no dropout.
Init (GPT-2 / nanoGPT): Linear and Embedding weights ~ N(0, 0.02), biases 0, LayerNorm (1, 0),
and both residual projections (attn.c_proj, mlp.c_proj) ~ N(0, 0.02 / sqrt(2 * n_layer)).

Parameter count N (all parameters, wte counted once because it is tied):
    N = V*C + P*C + L*(12*C*C + 13*C) + 2*C
flops_per_token(seq) = 6*N + 12*L*C*seq   (fwd+bwd; the second term is attention scores/values)
(optionally with N - P*C, i.e. without wpe: the nanoGPT convention used by src/models/gpt2.cpp)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    name: str
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int = 50257
    n_positions: int = 1024  # max sequence length (rows of wpe)
    seq: int = 1024          # default training sequence length for this size

    def to_dict(self) -> dict:
        return asdict(self)


# gpt2-tiny is the CPU/unit-test size: its wpe has 256 rows (n_positions = seq = 256).
CONFIGS: dict[str, GPTConfig] = {
    "gpt2-tiny":   GPTConfig("gpt2-tiny",   n_layer=2,  n_head=4,  n_embd=128,  vocab_size=256, n_positions=256, seq=256),
    "gpt2":        GPTConfig("gpt2",        n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": GPTConfig("gpt2-medium", n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large":  GPTConfig("gpt2-large",  n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl":     GPTConfig("gpt2-xl",     n_layer=48, n_head=25, n_embd=1600),
}


def get_config(name: str) -> GPTConfig:
    if name not in CONFIGS:
        raise SystemExit(f"unknown model {name!r}; known: {', '.join(CONFIGS)}")
    return CONFIGS[name]


def num_params(cfg: GPTConfig) -> int:
    """All parameters, tied wte counted once (equals sum(p.numel()) of GPT2 below)."""
    C, L, V, P = cfg.n_embd, cfg.n_layer, cfg.vocab_size, cfg.n_positions
    per_block = (2 * C) + (3 * C * C + 3 * C) + (C * C + C) + (2 * C) + (4 * C * C + 4 * C) + (4 * C * C + C)
    return V * C + P * C + L * per_block + 2 * C


def num_params_non_embedding(cfg: GPTConfig) -> int:
    """num_params minus the position table wpe (wte stays: it is the LM head). nanoGPT's N."""
    return num_params(cfg) - cfg.n_positions * cfg.n_embd


def flops_per_token(cfg: GPTConfig, seq: int, exclude_wpe: bool = False) -> int:
    """Training FLOPs per token (forward + backward): 6*N + 12*n_layer*n_embd*seq.

    N = all parameters (wte once) by default; exclude_wpe=True uses num_params_non_embedding
    (nanoGPT / PaLM convention, and what src/models/gpt2.cpp's flops_per_token uses).
    """
    n = num_params_non_embedding(cfg) if exclude_wpe else num_params(cfg)
    return 6 * n + 12 * cfg.n_layer * cfg.n_embd * seq


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0, "n_embd must be divisible by n_head"
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


@torch.no_grad()
def init_gpt2_module(name: str, m: nn.Module, std: float, proj_std: float) -> None:
    """GPT-2's initialisation of one module: Linear N(0, std), or N(0, proj_std) for c_proj,
    bias (if any) zero; Embedding N(0, std); LayerNorm ones and zeros."""
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, mean=0.0, std=proj_std if name.endswith("c_proj") else std)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Embedding):
        nn.init.normal_(m.weight, mean=0.0, std=std)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


class GPT2(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        std = 0.02
        proj_std = 0.02 / math.sqrt(2 * self.cfg.n_layer)
        for name, m in self.named_modules():
            init_gpt2_module(name, m, std, proj_std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        if T > self.cfg.n_positions:
            raise ValueError(f"sequence length {T} > n_positions {self.cfg.n_positions}")
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        logits = F.linear(x, self.wte.weight)  # tied head: x @ wte.T
        if targets is None:
            return logits
        return cross_entropy_loss(logits, targets)


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy computed in fp32 (same for our model and the HF model)."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


if __name__ == "__main__":  # print the size table
    for n, c in CONFIGS.items():
        print(f"{n:12s} L={c.n_layer:2d} H={c.n_head:2d} C={c.n_embd:4d} V={c.vocab_size:5d} P={c.n_positions:4d} "
              f"N={num_params(c):>13,d}  flops/token(seq={c.seq})={flops_per_token(c, c.seq):.4e}")
