"""reduce_scatter / all_gather bandwidth through torch.distributed (NCCL), nccl-tests conventions.

  torchrun --nproc_per_node 2 bench/anchors/collectives.py --json OUT.jsonl
  torchrun --nproc_per_node 2 bench/anchors/collectives.py --min-bytes 1M --max-bytes 1G --factor 4 --inplace both

Sizes are the FULL buffer: the reduce_scatter input / the all_gather output (as nccl-tests' "size"
column); each rank's shard is size / world.  For each size: warm-up calls, then --iters calls back to
back between two CUDA events on the current stream; time_us = elapsed / iters, averaged over ranks
(nccl-tests' default -a 1; the max over ranks is reported too).
  algbw = size / time                  (GB/s, 1e9)
  busbw = algbw * (world - 1) / world  (nccl-tests src/reduce_scatter.cu, src/all_gather.cu)
Every size is checked once after timing: inputs filled with rank+1, reduce_scatter must give
world*(world+1)/2 everywhere, all_gather must give r+1 in shard r.
"""

import os

for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)

import argparse
import datetime
import json
import sys
import time

import torch
import torch.distributed as dist

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
OPS = ("reduce_scatter", "all_gather")


def parse_size(s: str) -> int:
    s = s.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if mult > 1 else s) * mult)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default="reduce_scatter,all_gather", help="comma list of: " + ",".join(OPS))
    p.add_argument("--min-bytes", default="1M", help="smallest full size (K/M/G = KiB/MiB/GiB)")
    p.add_argument("--max-bytes", default="1G", help="largest full size")
    p.add_argument("--factor", type=int, default=2, help="size step factor (2 or 4)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    p.add_argument("--inplace", default="out", choices=("out", "in", "both"),
                   help="out-of-place (default), in-place (shard is a view of the full buffer), or both")
    p.add_argument("--json", default=None, help="append one line per (op, size, placement) (rank 0)")
    p.add_argument("--device", default=None, choices=("cuda", "cpu"), help="cpu = gloo, for testing")
    a = p.parse_args(argv)
    a.ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    for o in a.ops:
        if o not in OPS:
            raise SystemExit(f"unknown op {o!r}; known: {', '.join(OPS)}")
    a.min_bytes, a.max_bytes = parse_size(a.min_bytes), parse_size(a.max_bytes)
    if a.factor < 2 or a.min_bytes <= 0 or a.min_bytes > a.max_bytes or a.iters < 1:
        raise SystemExit("need --factor >= 2, 0 < --min-bytes <= --max-bytes, --iters >= 1")
    return a


def sizes(a):
    s = a.min_bytes
    while s <= a.max_bytes:
        yield s
        s *= a.factor


class Timer:
    def __init__(self, cuda: bool):
        self.cuda = cuda
        if cuda:
            self.t0, self.t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def start(self):
        if self.cuda:
            self.t0.record()
        else:
            self.w0 = time.perf_counter()

    def stop_us(self) -> float:
        if self.cuda:
            self.t1.record()
            self.t1.synchronize()
            return self.t0.elapsed_time(self.t1) * 1e3
        return (time.perf_counter() - self.w0) * 1e6


def main(argv=None):
    a = parse_args(argv)
    dev_type = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if dev_type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = DTYPES[a.dtype]
    esize = torch.empty((), dtype=dtype).element_size()

    nccl = None
    if dev_type == "cuda":
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    meta = {"framework": "pytorch", "bench": "collectives", "world": world, "dtype": a.dtype,
            "warmup": a.warmup, "iters": a.iters, "backend": dist.get_backend(),
            "device": torch.cuda.get_device_name(device) if dev_type == "cuda" else "cpu",
            "torch": torch.__version__, "nccl": nccl,
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}

    # One pair of buffers for the largest size; every size uses views (as nccl-tests does).
    max_shard = a.max_bytes // esize // world
    sendbuf = torch.empty(max_shard * world, dtype=dtype, device=device)
    recvbuf = torch.empty(max_shard * world, dtype=dtype, device=device)
    timer = Timer(dev_type == "cuda")
    placements = {"out": [False], "in": [True], "both": [False, True]}[a.inplace]
    out_f = open(a.json, "a") if (a.json and rank == 0) else None
    failures = 0
    if rank == 0:
        print(f"# world {world} dtype {a.dtype} backend {meta['backend']} device {meta['device']} "
              f"nccl {nccl}  NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}", file=sys.stderr)
        print(f"# {'op':>14} {'place':>5} {'size(B)':>12} {'time(us)':>10} {'algbw':>8} {'busbw':>8} {'wrong':>6}",
              file=sys.stderr)

    for op in a.ops:
        busbws = []
        for size in sizes(a):
            shard = size // esize // world
            if shard == 0:
                continue
            total = shard * world
            for inplace in placements:
                full = recvbuf[:total]
                if op == "reduce_scatter":
                    inp = full if inplace else sendbuf[:total]
                    out = full[rank * shard:(rank + 1) * shard] if inplace else recvbuf[:shard]
                    call = lambda: dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM)  # noqa: E731
                else:
                    out = full
                    inp = full[rank * shard:(rank + 1) * shard] if inplace else sendbuf[:shard]
                    call = lambda: dist.all_gather_into_tensor(out, inp)  # noqa: E731

                inp.fill_(rank + 1)
                for _ in range(a.warmup):
                    call()
                dist.barrier()
                timer.start()
                for _ in range(a.iters):
                    call()
                t_us = timer.stop_us() / a.iters

                # correctness: one fresh call with known inputs
                if op == "reduce_scatter":
                    inp.fill_(rank + 1)
                    call()
                    wrong = (out != world * (world + 1) // 2).sum()
                else:
                    out.zero_()
                    inp.fill_(rank + 1)
                    call()
                    expect = torch.arange(1, world + 1, device=device, dtype=dtype).repeat_interleave(shard)
                    wrong = (out != expect).sum()

                stats = torch.tensor([t_us, t_us, float(wrong)], dtype=torch.float64, device=device)
                tmax = stats[1:2].clone()
                dist.all_reduce(stats, op=dist.ReduceOp.SUM)
                dist.all_reduce(tmax, op=dist.ReduceOp.MAX)
                t_avg, n_wrong, t_max = float(stats[0]) / world, int(stats[2]), float(tmax[0])
                algbw = total * esize / (t_avg * 1e-6) / 1e9
                busbw = algbw * (world - 1) / world
                busbws.append(busbw)
                failures += n_wrong > 0
                if rank == 0:
                    rec = dict(meta)
                    rec.update(op=op, inplace=inplace, bytes=total * esize, shard_bytes=shard * esize,
                               count=total, time_us=round(t_avg, 2), time_us_max=round(t_max, 2),
                               algbw_gbps=round(algbw, 3), busbw_gbps=round(busbw, 3),
                               wrong=n_wrong, check="ok" if n_wrong == 0 else "FAILED")
                    line = json.dumps(rec)
                    print(line, flush=True)
                    if out_f:
                        out_f.write(line + "\n")
                        out_f.flush()
                    print(f"  {op:>14} {'in' if inplace else 'out':>5} {total * esize:>12d} {t_avg:>10.2f} "
                          f"{algbw:>8.2f} {busbw:>8.2f} {n_wrong:>6d}", file=sys.stderr, flush=True)
        if rank == 0 and busbws:
            print(f"# {op}: avg busbw {sum(busbws) / len(busbws):.2f} GB/s over {len(busbws)} points",
                  file=sys.stderr)

    if out_f:
        out_f.close()
    dist.barrier()
    dist.destroy_process_group()
    if failures:
        print(f"collectives: {failures} result(s) FAILED the data check", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
