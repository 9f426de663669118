#!/usr/bin/env python3
"""Side-by-side table of scripts/device/cifar_moe_2gpu.sh (also run by hand on its folder):
per dtype, the loss rank 0 printed every log interval by example_cifar10 (zt_<dtype>.log) and by
the DeepSpeed tutorial anchor (ds_<dtype>.json), then ms/step, peak memory, test accuracy and the
wall time of each run. Writes table.json beside the logs; prints markdown.

  python3 scripts/device/cifar_moe_table.py DIR
"""
import json
import os
import re
import sys

ZT_LOSS = re.compile(r"\[epoch (\d+), step (\d+)\] loss: ([0-9.naif]+)")
ZT_TIME = re.compile(r"timing: ([0-9.]+) ms/step over steps \d+-\d+, peak ([0-9.]+) MiB")
ZT_ACC = re.compile(r"accuracy on \d+ test images: ([0-9.]+)%")


def zerotrain_run(path):
    r = {"losses": {}, "ms_per_step": None, "peak_mib": None, "test_accuracy": None}
    if not os.path.exists(path):
        return r
    for line in open(path, errors="replace"):
        if not line.startswith("[rank 0]"):
            continue
        if m := ZT_LOSS.search(line):
            r["losses"][int(m.group(2))] = float(m.group(3))
        elif m := ZT_TIME.search(line):
            r["ms_per_step"], r["peak_mib"] = float(m.group(1)), float(m.group(2))
        elif m := ZT_ACC.search(line):
            r["test_accuracy"] = float(m.group(1))
    return r


def deepspeed_run(path):
    r = {"losses": {}, "ms_per_step": None, "peak_mib": None, "test_accuracy": None}
    try:
        j = json.loads(open(path).read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return r
    r.update({k: j.get(k) for k in ("ms_per_step", "peak_mib", "test_accuracy", "optimizer", "deepspeed", "status",
                                    "error", "device")})
    r["losses"] = {int(s): float(v) for s, v in j.get("losses", [])}
    return r


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def wall(d, name):
    try:
        return float(open(os.path.join(d, name + ".wall")).read())
    except (OSError, ValueError):
        return None


def main():
    d = sys.argv[1]
    dtypes = [f[3:-4] for f in sorted(os.listdir(d)) if f.startswith("zt_") and f.endswith(".log")]
    dtypes += [f[3:-5] for f in sorted(os.listdir(d)) if f.startswith("ds_") and f.endswith(".json")
               and f[3:-5] not in dtypes]
    out = {}
    for dt in dtypes:
        zt, ds = zerotrain_run(os.path.join(d, f"zt_{dt}.log")), deepspeed_run(os.path.join(d, f"ds_{dt}.json"))
        zt["wall_s"], ds["wall_s"] = wall(d, f"zt_{dt}"), wall(d, f"ds_{dt}")
        out[dt] = {"zerotrain": zt, "deepspeed": ds}
        print(f"### {dt}: loss (rank 0, mean over the log interval)\n")
        print("| step | zerotrain | DeepSpeed | zt - ds |\n|---:|---:|---:|---:|")
        for s in sorted(set(zt["losses"]) | set(ds["losses"])):
            a, b = zt["losses"].get(s), ds["losses"].get(s)
            diff = a - b if a is not None and b is not None else None
            print(f"| {s} | {fmt(a, '.3f')} | {fmt(b, '.3f')} | {fmt(diff, '+.3f')} |")
        print("\n| | zerotrain | DeepSpeed |\n|---|---:|---:|")
        print(f"| ms/step | {fmt(zt['ms_per_step'], '.2f')} | {fmt(ds['ms_per_step'], '.2f')} |")
        print(f"| peak MiB (rank 0) | {fmt(zt['peak_mib'], '.1f')} | {fmt(ds['peak_mib'], '.1f')} |")
        print(f"| test accuracy % | {fmt(zt['test_accuracy'], '.1f')} | {fmt(ds['test_accuracy'], '.1f')} |")
        print(f"| run wall s | {fmt(zt['wall_s'], '.0f')} | {fmt(ds['wall_s'], '.0f')} |")
        if ds.get("status") not in (None, "ok"):
            print(f"\nDeepSpeed: {ds.get('status')}: {ds.get('error')}")
        print(f"\nDeepSpeed {ds.get('deepspeed')}, optimizer {ds.get('optimizer')}, {ds.get('device')}\n")
    with open(os.path.join(d, "table.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
