#!/usr/bin/env python3
"""Anchor: zerotrain's GPT-2 forward against Hugging Face transformers.

For each case (a small config and the 124M "gpt2" config) this builds a randomly
initialised GPT2LMHeadModel, save_pretrained()s it to a temp dir, writes token ids,
runs bench/gpt2_logits (C++) on them and compares the logits with transformers':

  fp32: max |ours - hf| over all logits must be <= FP32_TOL (both in fp32; TF32 off).
  bf16: both sides run in bf16 and are compared with the fp32 reference; ours must be
        no worse than BF16_FACTOR x hf's own bf16 error + BF16_SLACK (bf16 rounding
        differs between kernels, so an absolute bound on ours-vs-hf would be arbitrary).

  export: gpt2_logits --export writes the model back with save_hf_gpt2; transformers'
        from_pretrained() of that directory must give logits identical (max diff 0) to
        the original model (fp32, same device).

Prints one JSON line per (case, dtype); exits 1 if any case fails, 2 on setup errors.
Needs torch, transformers and safetensors; no network (the models are random).

  python bench/anchors/hf_gpt2_compare.py --bin build/gpt2_logits [--device cuda|cpu]
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

FP32_TOL = 1e-4
BF16_FACTOR = 2.0
BF16_SLACK = 2e-2

CASES = {
    # Small: vocab not a multiple of 64 and T < n_positions, to catch layout slips.
    "small": dict(n_layer=2, n_head=4, n_embd=128, vocab_size=1000, n_positions=128, batch=2, seq=64),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024, batch=2, seq=128),
}


def run_ours(binary, model_dir, tokens, out, device, dtype, export_dir=None):
    cmd = [binary, model_dir, tokens, out, "--device", device, "--dtype", dtype]
    if export_dir:
        cmd += ["--export", export_dir]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    info = json.loads(p.stdout.strip().splitlines()[-1])
    return load_file(out)["logits"], info


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(here, "..", "..", "build", "gpt2_logits"),
                    help="path to the gpt2_logits executable")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of: " + ",".join(CASES))
    ap.add_argument("--dtypes", default="fp32,bf16")
    args = ap.parse_args()
    if not os.access(args.bin, os.X_OK):
        print(f"hf_gpt2_compare: {args.bin} is not an executable (build it: scripts/build.sh)", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 must mean fp32 on both sides
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)

    failed = False
    for name in args.cases.split(","):
        c = dict(CASES[name])
        batch, seq = c.pop("batch"), c.pop("seq")
        torch.manual_seed(0)
        special = {} if c["vocab_size"] > 50256 else dict(bos_token_id=None, eos_token_id=None)
        cfg = GPT2Config(**c, **special, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = GPT2LMHeadModel(cfg).eval()
        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(cfg.vocab_size, (batch, seq), generator=gen, dtype=torch.long)
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = os.path.join(tmp, "model")
            model.save_pretrained(model_dir)
            tok_path = os.path.join(tmp, "tokens.safetensors")
            save_file({"input_ids": ids}, tok_path)
            with torch.no_grad():
                ref32 = model.to(dev, torch.float32)(ids.to(dev)).logits.float().cpu()
            scale = ref32.abs().max().item()
            for dt in args.dtypes.split(","):
                out = os.path.join(tmp, f"logits_{dt}.safetensors")
                export_dir = os.path.join(tmp, "export") if dt == "fp32" else None
                ours, info = run_ours(args.bin, model_dir, tok_path, out, args.device, dt, export_dir)
                if dt == "fp32":
                    hf = ref32
                else:
                    torch_dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
                    low = copy.deepcopy(model).to(dev, torch_dt)  # keep the fp32 original intact
                    with torch.no_grad():
                        hf = low(ids.to(dev)).logits.float().cpu()
                    del low
                diff = (ours - hf).abs().max().item() if ours.shape == hf.shape else float("inf")
                row = {"anchor": "hf_gpt2", "case": name, "dtype": dt, "device": args.device,
                       "shape": list(ours.shape), "ref_max_abs": scale, "max_abs_diff_vs_hf": diff,
                       "ours_forward_ms": info.get("forward_ms")}
                if dt == "fp32":
                    row["tol"] = FP32_TOL
                    ok = diff <= FP32_TOL
                else:
                    ours_err = (ours - ref32).abs().max().item()
                    hf_err = (hf - ref32).abs().max().item()
                    row.update(ours_err_vs_fp32=ours_err, hf_err_vs_fp32=hf_err,
                               tol=BF16_FACTOR * hf_err + BF16_SLACK)
                    ok = ours_err <= row["tol"]
                row["ok"] = bool(ok and info.get("finite", False))
                failed |= not row["ok"]
                print(json.dumps(row), flush=True)
                if export_dir:
                    reloaded = GPT2LMHeadModel.from_pretrained(export_dir).eval().to(dev)
                    with torch.no_grad():
                        again = reloaded(ids.to(dev)).logits.float().cpu()
                    ediff = (again - ref32).abs().max().item()
                    row = {"anchor": "hf_gpt2", "case": name, "dtype": "export", "device": args.device,
                           "max_abs_diff_vs_hf": ediff, "tol": 0.0, "ok": ediff == 0.0}
                    failed |= not row["ok"]
                    print(json.dumps(row), flush=True)
                    del reloaded
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
