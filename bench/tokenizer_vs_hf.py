#!/usr/bin/env python3
"""Tokenizing throughput, zerotrain's BpeTokenizer (build/bench_tokenizer) against Hugging
Face `tokenizers` (encode_batch), the same documents and the same number of threads
(RAYON_NUM_THREADS for tokenizers). Checks that every id agrees, then prints one JSON
line per implementation and one with the ratio.

  python bench/tokenizer_vs_hf.py --bin build/bench_tokenizer \
      --tokenizer tests/fixtures/bpe/tokenizer.json --text /tmp/bpe_corpus.txt --threads 1 2
(/tmp/bpe_corpus.txt is written by scripts/make_bpe_fixture.py.)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def cut_documents(raw, doc_bytes):
    docs, start = [], 0
    while start < len(raw):
        end = start + doc_bytes
        if end >= len(raw):
            end = len(raw)
        else:
            nl = raw.find(b"\n", end)
            end = len(raw) if nl < 0 else nl + 1
        docs.append(raw[start:end].decode())
        start = end
    return docs


def hf_run(tokenizer, text, threads, doc_bytes, repeat):
    code = f"""
import json, sys, time
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from tokenizer_vs_hf import cut_documents
from tokenizers import Tokenizer
tok = Tokenizer.from_file({tokenizer!r})
raw = open({text!r}, 'rb').read()
docs = cut_documents(raw, {doc_bytes})
best = 1e30
for _ in range({repeat}):
    t0 = time.perf_counter()
    enc = tok.encode_batch(docs, add_special_tokens=False)
    best = min(best, time.perf_counter() - t0)
ids = [i for e in enc for i in e.ids]
import array
sys.stdout.buffer.write(array.array('I', ids).tobytes())
print(json.dumps(dict(impl='tokenizers', threads={threads}, documents=len(docs), bytes=len(raw), tokens=len(ids),
                      seconds=best, mb_per_s=len(raw) / best / 1e6, tokens_per_s=len(ids) / best)), file=sys.stderr)
"""
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True)
    return p.stdout, json.loads(p.stderr.decode().strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bench_tokenizer")
    ap.add_argument("--tokenizer", default="tests/fixtures/bpe/tokenizer.json")
    ap.add_argument("--text", default="/tmp/bpe_corpus.txt")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--doc-bytes", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    for t in a.threads:
        hf_ids, hf = hf_run(a.tokenizer, a.text, t, a.doc_bytes, a.repeat)
        with tempfile.NamedTemporaryFile(suffix=".ids") as f:
            out = subprocess.run([a.bin, "--tokenizer", a.tokenizer, "--text", a.text, "--threads", str(t),
                                  "--doc-bytes", str(a.doc_bytes), "--repeat", str(a.repeat), "--ids-out", f.name],
                                 capture_output=True, check=True, text=True)
            zt = json.loads(out.stdout.strip().splitlines()[-1])
            zt_ids = open(f.name, "rb").read()
        same = zt_ids == hf_ids
        zt["ids_equal_tokenizers"] = same
        print(json.dumps(hf))
        print(json.dumps(zt))
        print(json.dumps({"threads": t, "speedup_vs_tokenizers": hf["seconds"] / zt["seconds"], "ids_equal": same}))
        if not same:
            sys.exit(f"ids differ from tokenizers at {t} threads")


if __name__ == "__main__":
    main()
