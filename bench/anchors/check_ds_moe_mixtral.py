#!/usr/bin/env python3
"""Checks ds_moe_anchor.py's --arch mixtral model against transformers' MixtralForCausalLM: a tiny
Mixtral (2 layers, hidden 64, 4 heads / 2 kv heads, 4 experts, top-2, RoPE theta 1e6, vocab 512),
the HF model's weights copied into the anchor's (norm weights moved off 1 and the gate scaled x20 so
that the check sees them), one process, ep 1, dropless, fp32 on CPU: the anchor's cross entropy on
the same tokens equals HF's within 1e-5 (measured: 0.0; RoPE theta 1e4 instead misses by 1.9e-4,
w1/w3 swapped by 1.1e-4). Needs DeepSpeed and transformers on PYTHONPATH:
  DS_ACCELERATOR=cpu PYTHONPATH=<deepspeed>:<transformers> python3 bench/anchors/check_ds_moe_mixtral.py
"""
import argparse
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
for k, v in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29733", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0").items():
    os.environ.setdefault(k, v)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import MixtralConfig, MixtralForCausalLM  # noqa: E402

import ds_moe_anchor as A  # noqa: E402


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    h = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=1e6, num_local_experts=4,
             num_experts_per_tok=2, router_aux_loss_coef=0.02, output_router_logits=True, router_jitter_noise=0.0,
             initializer_range=0.02, tie_word_embeddings=False, max_position_embeddings=64)
    a = argparse.Namespace(experts=4, k=2, ep=1, capacity_factor=1.0, min_capacity=4, drop_tokens=False,
                           aux_coef=0.0, seed=1)
    m = A.MoEMixtral(h, a, 0).eval()
    torch.manual_seed(0)
    hf = MixtralForCausalLM(MixtralConfig(**h)).eval()
    sd = hf.state_dict()
    mine = dict(m.named_parameters())
    ff = h["intermediate_size"]
    with torch.no_grad():
        hf.model.norm.weight.add_(0.1)
        mine["embed_tokens.weight"].copy_(sd["model.embed_tokens.weight"])
        mine["norm.weight"].copy_(hf.model.norm.weight)
        mine["lm_head.weight"].copy_(sd["lm_head.weight"])
        for i, layer in enumerate(hf.model.layers):
            for n in ("input_layernorm", "post_attention_layernorm"):
                getattr(layer, n).weight.add_(0.05 * (i + 1))
                mine[f"layers.{i}.{n}.weight"].copy_(getattr(layer, n).weight)
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                mine[f"layers.{i}.self_attn.{n}.weight"].copy_(getattr(layer.self_attn, n).weight)
            moe = layer.mlp if hasattr(layer, "mlp") else layer.block_sparse_moe
            moe.gate.weight.mul_(20)  # sharper routing: the experts' choice matters
            mine[f"layers.{i}.moe.deepspeed_moe.gate.wg.weight"].copy_(moe.gate.weight)
            ours = m.layers[i].moe.deepspeed_moe.experts.deepspeed_experts
            for e in range(h["num_local_experts"]):
                if hasattr(moe.experts, "gate_up_proj"):  # transformers 5: fused [E, 2 ff, d], [E, d, ff]
                    gu, w2 = moe.experts.gate_up_proj[e], moe.experts.down_proj[e]
                    w1, w3 = gu[:ff], gu[ff:]
                else:  # transformers 4: experts.<e>.w1/w2/w3
                    w1, w2, w3 = (getattr(moe.experts[e], n).weight for n in ("w1", "w2", "w3"))
                ours[e].w1.weight.copy_(w1)
                ours[e].w2.weight.copy_(w2)
                ours[e].w3.weight.copy_(w3)
    torch.manual_seed(1)
    idx = torch.randint(0, h["vocab_size"], (2, 17))
    x, y = idx[:, :-1], idx[:, 1:]
    with torch.no_grad():
        ref = hf(input_ids=x).logits
        ref_loss = F.cross_entropy(ref.float().reshape(-1, ref.size(-1)), y.reshape(-1)).item()
        loss = m(x, y).item()
    print(f"anchor {loss:.7f}  transformers {ref_loss:.7f}  |diff| {abs(loss - ref_loss):.2e}  "
          f"layer-0 assignments per expert {m.layers[0].exp_counts.tolist()}")
    if abs(loss - ref_loss) > 1e-5:
        raise SystemExit("FAIL: the anchor's Mixtral differs from transformers'")
    print("OK")


if __name__ == "__main__":
    main()
