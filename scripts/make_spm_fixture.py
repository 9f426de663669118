#!/usr/bin/env python3
"""Makes the SentencePiece fixture of tests/unit/test_sentencepiece.cpp with the
`sentencepiece` package (offline, deterministic):

  python scripts/make_spm_fixture.py   (after scripts/make_bpe_fixture.py wrote /tmp/bpe_corpus.txt)

A Llama 2 / Mistral style BPE model (model_type bpe, byte_fallback, split_digits,
identity normalization, dummy prefix, whitespace kept) of 2000 pieces trained on the
1.2 MB corpus, and the ids `sentencepiece` gives for the BPE fixture's test text:
tests/fixtures/spm/{spm.model, expected.u16}.
"""
import argparse
import os
import struct

import sentencepiece as spm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/spm")
    ap.add_argument("--corpus", default="/tmp/bpe_corpus.txt")
    ap.add_argument("--text", default="tests/fixtures/bpe/test.txt")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    prefix = os.path.join(a.out, "spm")
    spm.SentencePieceTrainer.train(
        input=a.corpus, model_prefix=prefix, vocab_size=2000, model_type="bpe", byte_fallback=True,
        split_digits=True, normalization_rule_name="identity", add_dummy_prefix=True,
        remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, character_coverage=0.9995,
        user_defined_symbols=["<|im_start|>", "<|im_end|>"], max_sentence_length=1 << 16,
        num_threads=1, minloglevel=2, unk_surface=" \u2047 ")
    os.remove(prefix + ".vocab")
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    text = open(a.text, encoding="utf-8", newline="").read()  # keep CR LF as they are
    # Line by line, as a data pipeline feeds documents; ids of all lines back to back.
    ids = []
    lines = text.split("\n")[:2000]
    for line in lines:
        ids.extend(sp.encode(line))
        ids.append(-1 & 0xFFFF)  # 65535 separates lines
    assert max(i for i in ids if i != 65535) < 2000
    with open(os.path.join(a.out, "expected.u16"), "wb") as f:
        f.write(struct.pack(f"<{len(ids)}H", *ids))
    print(f"{len(lines)} lines, {len(ids)} ids")


if __name__ == "__main__":
    main()
