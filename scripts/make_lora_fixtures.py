#!/usr/bin/env python3
"""Fixtures for tests/unit/test_lora.cpp: peft LoRA adapters with non-zero random A and B on
small Hugging Face models, and peft's logits.

    python scripts/make_lora_fixtures.py [OUT_DIR]          (default: tests/fixtures/lora)

Writes OUT_DIR/<case>/ with
    adapter_config.json, adapter_model.safetensors   peft's save_pretrained
    io.safetensors        input_ids (2, 16) int64, logits (2, 16, V) fp32 of the adapted
                          model (eval mode), base_logits of the base model alone
and, for the GPT-2 case, OUT_DIR/gpt2_base/ (config.json, model.safetensors): a tiny
GPT2LMHeadModel (2 layers, n_embd 32, 4 heads, vocab 128, 64 positions).
Cases:
    llama          base tests/fixtures/llama/llama; r 4, lora_alpha 8, all seven linear kinds
    llama_rslora   same base; r 2, lora_alpha 3, rsLoRA, target_modules a regex
                   (q_proj and down_proj of layer 1 only)
    gpt2           base OUT_DIR/gpt2_base; r 4, lora_alpha 16, c_attn, c_proj, c_fc
                   (Conv1D: peft sets fan_in_fan_out)
A and B are drawn N(0, 0.3) (peft would start B at zero, which would not test it).

    python scripts/make_lora_fixtures.py verify BASE_DIR ADAPTER_DIR LOGITS_FILE
loads BASE_DIR with transformers and ADAPTER_DIR with peft.PeftModel.from_pretrained,
runs LOGITS_FILE's input_ids (a safetensors file with input_ids and logits, e.g. what a
zerotrain test wrote) and prints the max abs difference of the logits (exit 1 above 1e-4).

Needs torch, transformers, peft and safetensors (not installed by scripts/setup.sh: the
fixtures are committed; regenerate them only when changing the cases).
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

B, T = 2, 16
HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA_BASE = os.path.join(HERE, "..", "tests", "fixtures", "llama", "llama")


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float().contiguous()


def make_gpt2_base(d):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(4321)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0,
                     eos_token_id=0)
    model = GPT2LMHeadModel(cfg).float().eval()
    with torch.no_grad():  # non-zero biases and LayerNorm parameters, so the test sees them used
        for name, p in model.named_parameters():
            if name.endswith(".bias") or ".ln_" in name:
                p.add_(torch.randn(p.shape) * 0.1)
    model.save_pretrained(d, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))


def make_case(out_dir, name, base_dir, lora_kwargs, vocab):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, vocab, (B, T), generator=gen)
    base_logits = logits_of(base, ids)
    torch.manual_seed(11)
    model = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", **lora_kwargs)).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    logits = logits_of(model, ids)
    delta = (logits - base_logits).abs().max().item()
    assert delta > 1e-2, f"{name}: the adapter moves the logits by only {delta}"
    d = os.path.join(out_dir, name)
    model.save_pretrained(d)
    cfg_path = os.path.join(d, "adapter_config.json")
    cfg = json.load(open(cfg_path))
    cfg["base_model_name_or_path"] = os.path.relpath(base_dir, os.path.join(HERE, ".."))  # not a machine path
    json.dump(cfg, open(cfg_path, "w"), indent=2, sort_keys=True)
    if os.path.exists(os.path.join(d, "README.md")):
        os.remove(os.path.join(d, "README.md"))
    save_file({"input_ids": ids.contiguous(), "logits": logits, "base_logits": base_logits},
              os.path.join(d, "io.safetensors"))
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"{name}: adapter moves the logits by up to {delta:.3g}; {size / 1024:.0f} KB")


def make(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    make_case(out_dir, "llama", LLAMA_BASE,
              dict(r=4, lora_alpha=8, lora_dropout=0.0,
                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
              128)
    make_case(out_dir, "llama_rslora", LLAMA_BASE,
              dict(r=2, lora_alpha=3, lora_dropout=0.0, use_rslora=True,
                   target_modules=r"model\.layers\.1\.(self_attn\.q_proj|mlp\.down_proj)"), 128)
    gpt2_base = os.path.join(out_dir, "gpt2_base")
    make_gpt2_base(gpt2_base)
    make_case(out_dir, "gpt2", gpt2_base,
              dict(r=4, lora_alpha=16, lora_dropout=0.0, target_modules=["c_attn", "c_proj", "c_fc"],
                   fan_in_fan_out=True), 128)


def verify(base_dir, adapter_dir, logits_file):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    io = load_file(logits_file)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    diff = (logits_of(model, io["input_ids"]) - io["logits"].float()).abs().max().item()
    print(f"peft {adapter_dir} on {base_dir}: max abs logits difference from {logits_file}: {diff:.3g}")
    return 0 if diff <= 1e-4 else 1


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "verify":
        sys.exit(verify(sys.argv[2], sys.argv[3], sys.argv[4]))
    make(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures", "lora"))
