"""Pre-flight check of the anchor scripts on gpt2-tiny (CPU/gloo here, or CUDA/NCCL on the GPU box).

  python bench/anchors/smoke_anchors.py --device cpu  --nproc 2      # ~8 min on 2 cores
  python bench/anchors/smoke_anchors.py --device cuda --nproc 2      # < 1 min on H100/H200

Checks:
  1. gpt2.py: parameter counts of every named size (GPT-2 124M = 124,439,808) and flops_per_token.
  2. every mode runs and writes one JSON line with status "ok" and the schema keys
     (on cuda: memory fields are numbers, on cpu: null);
  3. in fp32 the distributed modes (ddp, zero1, fsdp2, fsdp2_reshard, fsdp2_offload) follow the same
     loss trajectory (same init, same data, same math; tolerance --tol);
  4. a simulated OOM on rank 1 gives exactly one {"status": "oom"} line and exit code 0;
  5. collectives.py passes its data check on a few small sizes.
"""

import os

for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)

import argparse
import json
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpt2  # noqa: E402

DIST = ["ddp", "zero1", "fsdp2", "fsdp2_reshard", "fsdp2_offload"]
KEYS = ["framework", "mode", "model", "world", "micro_batch", "seq", "dtype", "steps", "ms_per_iter", "phase_ms",
        "phase_mem_gib", "peak_gib", "tokens_per_s", "tflops_per_gpu", "mfu", "loss_first", "loss_last", "device"]


def torchrun(nproc, script, extra, log):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           os.path.join(HERE, script)] + extra
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=900).returncode


def python(script, extra, log):
    cmd = [sys.executable, os.path.join(HERE, script)] + extra
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=900).returncode


def lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--tol", type=float, default=None, help="loss tolerance (default 1e-5 cpu, 2e-3 cuda)")
    p.add_argument("--skip-hf", action="store_true", help="skip --mode hf (no transformers)")
    a = p.parse_args()
    tol = a.tol if a.tol is not None else (1e-5 if a.device == "cpu" else 2e-3)
    tmp = tempfile.mkdtemp(prefix="anchor_smoke_")
    log = os.path.join(tmp, "log.txt")
    env_note = f"logs in {log}"
    fails = []

    def check(cond, what):
        print(("ok    " if cond else "FAIL  ") + what, flush=True)
        if not cond:
            fails.append(what)

    # 1. sizes
    check(gpt2.num_params(gpt2.get_config("gpt2")) == 124_439_808, "gpt2 has 124,439,808 parameters")
    for name, cfg in gpt2.CONFIGS.items():
        if cfg.n_layer <= 12:  # instantiating the big ones costs minutes of CPU
            m = gpt2.GPT2(cfg)
            check(sum(q.numel() for q in m.parameters()) == gpt2.num_params(cfg), f"{name}: num_params formula")

    common = ["--model", "gpt2-tiny", "--micro-batch", "2", "--seq", "64", "--steps", "3", "--warmup", "1",
              "--device", a.device]

    # 2 + 3. every mode, fp32 (trajectory) and bf16 (recipe)
    for dtype in ("fp32", "bf16"):
        out = os.path.join(tmp, f"modes_{dtype}.jsonl")
        for mode in DIST:
            rc = torchrun(a.nproc, "train_anchor.py", ["--mode", mode, "--dtype", dtype, "--json", out] + common, log)
            check(rc == 0, f"{mode} {dtype}: exit code {rc}")
        singles = ["single"] + ([] if a.skip_hf else ["hf"])
        for mode in singles:
            rc = python("train_anchor.py", ["--mode", mode, "--dtype", dtype, "--json", out] + common, log)
            check(rc == 0, f"{mode} {dtype}: exit code {rc}")
        recs = {r["mode"]: r for r in lines(out)}
        for mode in DIST + singles:
            r = recs.get(mode)
            check(r is not None and r.get("status") == "ok", f"{mode} {dtype}: status ok")
            if not r:
                continue
            missing = [k for k in KEYS if k not in r]
            check(not missing, f"{mode} {dtype}: schema keys present {missing or ''}")
            mem_ok = all((r["phase_mem_gib"][ph]["peak"] is None) == (a.device == "cpu") for ph in r["phase_mem_gib"])
            check(mem_ok, f"{mode} {dtype}: memory fields {'null' if a.device == 'cpu' else 'numbers'}")
        if dtype == "fp32" and all(m in recs for m in DIST):
            ref = recs["ddp"]["losses"]
            for mode in DIST[1:]:
                diff = max(abs(x - y) for x, y in zip(ref, recs[mode]["losses"]))
                check(diff <= tol, f"fp32 loss trajectory {mode} vs ddp: max diff {diff:.2e} (tol {tol:g})")

    # 4. OOM on rank 1
    out = os.path.join(tmp, "oom.jsonl")
    rc = torchrun(a.nproc, "train_anchor.py", ["--mode", "fsdp2", "--json", out, "--simulate-oom", "backward:1:1"]
                  + common, log)
    recs = lines(out)
    check(rc == 0 and len(recs) == 1 and recs[0]["status"] == "oom" and recs[0]["phase"] == "backward"
          and recs[0]["oom_rank"] == 1, f"simulated OOM on rank 1: rc {rc}, lines {recs and recs[0].get('status')}")

    # 5. collectives
    out = os.path.join(tmp, "coll.jsonl")
    rc = torchrun(a.nproc, "collectives.py", ["--device", a.device, "--min-bytes", "256K", "--max-bytes", "4M",
                                               "--factor", "4", "--iters", "3", "--warmup", "1", "--inplace", "both",
                                               "--json", out], log)
    recs = lines(out)
    check(rc == 0 and len(recs) == 12 and all(r["check"] == "ok" for r in recs),
          f"collectives: rc {rc}, {len(recs)} lines, all checks ok")

    print(f"\n{len(fails)} failure(s); {env_note}")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
