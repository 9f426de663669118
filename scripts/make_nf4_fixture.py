#!/usr/bin/env python
"""Writes tests/fixtures/nf4/nf4_bnb.safetensors: bitsandbytes' NF4 quantization
(quantize_4bit(quant_type="nf4", blocksize=64, compress_statistics=True)) of a few
fp32 tensors, for tests/unit/test_nf4.cpp to compare with byte for byte.
Needs bitsandbytes (runs on CPU): pip install bitsandbytes.
Per case i: in_i (F32), packed_i (U8, two codes a byte, first in the high nibble),
qabsmax_i (U8), absmax2_i (F32, per 256 absmaxes), offset_i (F32 [1]),
code2_i (F32 [256], the state2 code table bitsandbytes stored), deq_i (F32)."""
import os, sys
import torch
import bitsandbytes as bnb
import bitsandbytes.functional as F
from safetensors.torch import save_file

torch.manual_seed(1234)
sizes = [64, 100, 7, 3 * 50, 1000, 301 * 64 - 54]  # incl. partial blocks of 64 and 256
out = {}
for i, n in enumerate(sizes):
    x = torch.randn(n) * (0.5 + i)
    if n >= 100:
        x[10:20] = 0.0          # exact zeros
        x[64:128] = 0.0 if n >= 128 else x[64:128]  # an all-zero block where there is one
    q, st = F.quantize_4bit(x, blocksize=64, quant_type="nf4", compress_statistics=True)
    d = F.dequantize_4bit(q, st)
    out[f"in_{i}"] = x.contiguous()
    out[f"packed_{i}"] = q.reshape(-1).contiguous()
    out[f"qabsmax_{i}"] = st.absmax.reshape(-1).contiguous()
    out[f"absmax2_{i}"] = st.state2.absmax.reshape(-1).float().contiguous()
    out[f"offset_{i}"] = st.offset.reshape(1).float().contiguous()
    out[f"code2_{i}"] = st.state2.code.float().contiguous()
    out[f"deq_{i}"] = d.reshape(-1).float().contiguous()
dst = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(__file__), "..", "tests", "fixtures", "nf4", "nf4_bnb.safetensors")
save_file(out, dst, metadata={"bitsandbytes": bnb.__version__, "torch": torch.__version__,
                              "cases": str(len(sizes))})
print("wrote", dst, "bitsandbytes", bnb.__version__)
