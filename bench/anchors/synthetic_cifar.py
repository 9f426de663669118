#!/usr/bin/env python3
"""The synthetic CIFAR-10 of tests/support/synthetic_cifar.h (write_synthetic_cifar), from Python:
the same draws from the same CPU generator, so the same bytes for the same --per-file and --seed
when this torch is the LibTorch zerotrain was built against (the CPU normal and randint kernels
are the same code; checked byte for byte against the header, see --check).

  data_batch_1..5.bin and test_batch.bin, --per-file records each (1 label byte + 3072 pixel
  bytes, CHW): label ~ U{0..9}, pixels = clamp(round(128 + mean[label] + N(0, 30)), 0, 255),
  mean[label] a fixed (3, 32, 32) image per class with std 60 (learnable classes).

  python3 bench/anchors/synthetic_cifar.py DIR [--per-file 2000] [--seed 7]
  python3 bench/anchors/synthetic_cifar.py DIR --check OTHER_DIR   # compare with files written elsewhere
"""
import argparse
import os
import sys

import torch

NAMES = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]


def write_synthetic_cifar(out_dir, per_file, seed):
    os.makedirs(out_dir, exist_ok=True)
    g = torch.Generator(device="cpu").manual_seed(seed)
    # The draw order is the header's: the class means, then per file its labels, then its noise.
    means = torch.randn((10, 3, 32, 32), generator=g) * 60.0
    for name in NAMES:
        labels = torch.randint(0, 10, (per_file,), generator=g)
        noise = torch.randn((per_file, 3, 32, 32), generator=g) * 30.0
        images = (128.0 + means.index_select(0, labels) + noise).round().clamp(0, 255).to(torch.uint8)
        records = torch.cat([labels.to(torch.uint8).unsqueeze(1), images.reshape(per_file, 3072)], 1).contiguous()
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(records.numpy().tobytes())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--per-file", type=int, default=2000, help="records per file (5 train files + 1 test file)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--check", default="", help="a directory of files written elsewhere: compare bytes, exit 1 if any differ")
    a = p.parse_args()
    if a.per_file < 1:
        p.error("--per-file must be >= 1")
    write_synthetic_cifar(a.dir, a.per_file, a.seed)
    print(f"synthetic CIFAR-10: {a.dir} ({5 * a.per_file} train + {a.per_file} test records, seed {a.seed}, "
          f"torch {torch.__version__})")
    if a.check:
        bad = []
        for name in NAMES:
            with open(os.path.join(a.dir, name), "rb") as x, open(os.path.join(a.check, name), "rb") as y:
                if x.read() != y.read():
                    bad.append(name)
        print("check against", a.check, ":", "identical" if not bad else "DIFFERENT: " + " ".join(bad))
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
