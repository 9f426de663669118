"""torch.optim.Adam(fused=True) on the CPU: the stock-PyTorch anchor of `zerotrain bench adam`.

  python bench/anchors/torch_cpu_adam.py                      # 774e6 params (GPT-2 large), fused
  python bench/anchors/torch_cpu_adam.py --params 1e8 --threads 1,8,16 --impl both --json OUT.jsonl

One flat fp32 parameter of N elements with an fp32 gradient (torch's fused CPU Adam needs the
gradient in the parameter's dtype), lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01
(--adamw for torch.optim.AdamW). For each thread count (torch.set_num_threads): one warm-up
step, validated on three slices against the single-tensor reference implementation
(foreach=False, fused=False) within 1e-6 relative, then --iters timed steps; the median is
reported. Bytes moved per parameter, as zerotrain's bench counts them: grad read 4 B +
param, exp_avg, exp_avg_sq read and written 24 B = 28 B (zerotrain with bf16 grads and a
bf16 copy out also moves 28 B). One JSON line per result on stdout (and appended to --json).
"""

import argparse
import json
import os
import statistics
import time

import torch

SLICE = 4099


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=float, default=774e6, help="parameters (default 774e6)")
    p.add_argument("--threads", default=None, help="comma-separated thread counts (default 1,2,4,..,cores)")
    p.add_argument("--iters", type=int, default=5, help="timed steps per thread count (median reported)")
    p.add_argument("--impl", choices=["fused", "foreach", "both"], default="fused")
    p.add_argument("--adamw", action="store_true", help="torch.optim.AdamW instead of Adam")
    p.add_argument("--json", default=None, help="also append the JSON lines to this file")
    return p.parse_args(argv)


def default_threads():
    cores = os.cpu_count() or 1
    t, x = [], 1
    while x < cores:
        t.append(x)
        x *= 2
    return t + [cores]


def make_opt(param, impl, adamw):
    cls = torch.optim.AdamW if adamw else torch.optim.Adam
    kw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    if impl == "fused":
        return cls([param], fused=True, **kw)
    if impl == "foreach":
        return cls([param], foreach=True, **kw)
    return cls([param], foreach=False, fused=False, **kw)


def slices(n):
    return [(o, min(SLICE, n)) for o in sorted({0, max(0, min(n // 2 + 3, n - SLICE)), max(0, n - SLICE)})]


def main(argv=None):
    args = parse_args(argv)
    n = int(args.params)
    threads = [int(t) for t in args.threads.split(",")] if args.threads else default_threads()
    impls = ["fused", "foreach"] if args.impl == "both" else [args.impl]
    gen = torch.Generator().manual_seed(0)
    print(f"torch_cpu_adam: {n} params, torch {torch.__version__}, "
          f"cpu capability {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores", flush=True)
    out = open(args.json, "a") if args.json else None
    ok = True
    for impl in impls:
        for t in threads:
            torch.set_num_threads(t)
            param = torch.nn.Parameter(torch.empty(n).uniform_(-1, 1, generator=gen))
            param.grad = torch.empty(n).uniform_(-4, 4, generator=gen)
            opt = make_opt(param, impl, args.adamw)
            # Reference for the warm-up step on a few slices (fresh state, like the big one).
            expected = []
            for off, ln in slices(n):
                ref = torch.nn.Parameter(param.detach()[off:off + ln].clone())
                ref.grad = param.grad[off:off + ln].clone()
                make_opt(ref, "single", args.adamw).step()
                expected.append((off, ln, ref.detach()))
            opt.step()
            valid = all(torch.allclose(param.detach()[o:o + ln], e, rtol=1e-6, atol=1e-9) for o, ln, e in expected)
            ok = ok and valid
            times = []
            for _ in range(args.iters):
                t0 = time.perf_counter()
                opt.step()
                times.append(time.perf_counter() - t0)
            med = statistics.median(times)
            pps = n / med
            rec = {
                "bench": "torch_cpu_adam", "impl": impl, "optimizer": "AdamW" if args.adamw else "Adam",
                "threads": t, "params": n, "grad_dtype": "fp32", "bytes_per_param": 28, "iters": args.iters,
                "median_s": med, "min_s": min(times), "params_per_s": pps, "gb_per_s": pps * 28 / 1e9,
                "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                "valid": valid,
            }
            line = json.dumps(rec)
            print(line, flush=True)
            if out:
                out.write(line + "\n")
                out.flush()
            del opt, param
    if out:
        out.close()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
