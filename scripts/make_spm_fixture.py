#!/usr/bin/env python3
"""Makes the SentencePiece fixture of tests/unit/test_sentencepiece.cpp with the
`sentencepiece` package (offline, deterministic):

  python scripts/make_spm_fixture.py   (after scripts/make_bpe_fixture.py wrote /tmp/bpe_corpus.txt)

A Llama 2 / Mistral style BPE model (model_type bpe, byte_fallback, split_digits,
identity normalization, dummy prefix, whitespace kept) of 2000 pieces trained on the
1.2 MB corpus, and the ids `sentencepiece` gives for the BPE fixture's test text:
tests/fixtures/spm/{spm.model, expected.u16}.

  python scripts/make_spm_fixture.py --charsmap   (needs no corpus file)

The NFKC fixtures of tests/fixtures/spm_nfkc/: BPE models trained with sentencepiece's
default `nmt_nfkc` rule and with `nmt_nfkc_cf` (precompiled charsmaps) on a corpus of
full-width forms, ligatures, compatibility characters, NBSP and ideographic spaces,
combining sequences, control characters, emoji and CJK; see make_charsmap_fixtures.
"""
import argparse
import os
import struct
import sys

import sentencepiece as spm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/spm")
    ap.add_argument("--corpus", default="/tmp/bpe_corpus.txt")
    ap.add_argument("--text", default="tests/fixtures/bpe/test.txt")
    ap.add_argument("--charsmap", action="store_true", help="make tests/fixtures/spm_nfkc instead")
    a = ap.parse_args()
    if a.charsmap:
        make_charsmap_fixtures("tests/fixtures/spm_nfkc")
        return
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


# Lines that exercise nmt_nfkc: full-width letters and digits, ligatures, circled and
# squared compatibility forms, NBSP / ideographic / en spaces, combining sequences (NFD
# input, a spacing diaeresis that NFKC turns into " " + U+0308), control characters
# (deleted or turned into spaces), emoji with ZWJ and skin tones, CJK and Hangul jamo,
# user-defined symbols next to characters the charsmap maps.
CHARSMAP_LINES = [
    "Ｈｅｌｌｏ　ＷＯＲＬＤ １２３ ＡＢＣ ａｂｃ！？",
    "ﬁnance ﬂower ﬃ ﬀ ﬆ Ǆ ǅ Ĳ ŉ",
    "① ② ⑩ ⑳ ㍻ ㍼ ㌔ ㎏ ㎞ ℡ ™ № Ⅻ ⅻ ½ ¼ ² ³ ℃",
    "a\u00a0b\u3000c\u2002d\u2003e\u2009f\u200bg  h\u00a0\u00a0i",
    "\u3000\u3000leading ideographic spaces and trailing\u00a0\u00a0",
    "cafe\u0301 nai\u0308ve A\u030a e\u0301\u0323 \u1100\u1161\u11a8 \u00a8x \u00b4y \u02dcz",
    "tab\there\x01ctl\x07bell\x1fus\x7fdel\u200dzwj\ufeffbom\u0085nel end",
    "emoji 😀 👍🏽 👨\u200d👩\u200d👧 🇯🇵 ❤\ufe0f ☺",
    "漢字かなカナ ｶﾀｶﾅ ﾊﾟﾋﾟ 한국어 你好，世界。「引用」 （括弧）",
    "<|im_end|>①②ﬁ<|im_end|> ①② ＜｜ｉｍ＿ｅｎｄ｜＞",
    "Ωμέγα Привет ΣΊΣΥΦΟΣ Straße ǅemal ﬅ ＫＥＬＶＩＮ K Å",
    "plain ascii text with no mapped character at all, 42 words.",
    "the quick brown fox jumps over the lazy dog",
    "  spaces   inside\u3000\u3000and  around  ",
    "",
]
# Malformed UTF-8 (a lone 0xFF, a truncated sequence, an overlong 0xC3 0x28, a surrogate):
# sentencepiece turns each bad byte into U+FFFD.
CHARSMAP_BAD_UTF8 = b"bad \xff utf8 \xe2\x82 x\xc3( \xed\xa0\x80 \xef\xbc\xa1 end"


def darts_prefix_matches(units, key):
    """(length, value) of every trie key that is a prefix of `key` (bytes): Darts-clone's
    commonPrefixSearch over the double array `units` (uint32 each)."""
    out = []
    node = 0
    unit = units[node]
    node ^= (unit >> 10) << ((unit & (1 << 9)) >> 6)
    for i, b in enumerate(key):
        node ^= b
        if node >= len(units):
            break
        unit = units[node]
        if unit & ((1 << 31) | 0xFF) != b:
            break
        node ^= (unit >> 10) << ((unit & (1 << 9)) >> 6)
        if (unit >> 8) & 1:
            out.append((i + 1, units[node] & ((1 << 31) - 1)))
    return out


def charsmap_hits(blob, lines):
    """{source bytes: target bytes} of the charsmap entries that match anywhere in `lines`."""
    (n,) = struct.unpack("<I", blob[:4])
    units = struct.unpack(f"<{n // 4}I", blob[4:4 + n])
    pool = blob[4 + n:]
    hits = {}
    for b in lines:
        for i in range(len(b)):
            for length, value in darts_prefix_matches(units, b[i:]):
                hits[b[i:i + length]] = pool[value:pool.index(b"\0", value)]
    return hits


def make_charsmap_fixtures(out):
    """BPE models with nmt_nfkc / nmt_nfkc_cf and the ids sentencepiece gives for
    CHARSMAP_LINES: {nfkc,nfkc_cf}.model, test.txt, expected.tsv.

    The full nmt_nfkc charsmap is 240 KB, so the committed models hold the subset of it
    that the test lines hit (every entry that matches at any byte of any line), compiled
    by sentencepiece's own builder (normalization_rule_tsv). Longest-prefix matching over
    the subset is then the same as over the whole map on these lines; the script checks
    that the ids of the subset model equal the full model's on every line."""
    import tempfile

    from sentencepiece import sentencepiece_model_pb2 as pb

    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    corpus = os.path.join(tmp, "corpus.txt")
    base = open("tests/fixtures/bpe/test.txt", encoding="utf-8").read()[:80000]
    norm = open("tests/fixtures/bpe/normalize.txt", encoding="utf-8").read()
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(base + "\n" + norm + "\n" + "\n".join(CHARSMAP_LINES * 20) + "\n")
    lines = [l.encode("utf-8") for l in CHARSMAP_LINES] + [CHARSMAP_BAD_UTF8]
    assert all(b"\n" not in l and b"\r" not in l for l in lines)
    # nfkc_cf also gets a denormalizer (applied by decode): "fi" -> U+FB01, "1" -> U+2460,
    # "..." -> U+2026, "kg" -> U+338F.
    denorm = os.path.join(tmp, "denorm.tsv")
    with open(denorm, "w") as f:
        f.write("66 69\tFB01\n31\t2460\n2E 2E 2E\t2026\n6B 67\t338F\n")
    columns = {}
    for rule, name in [("nmt_nfkc", "nfkc"), ("nmt_nfkc_cf", "nfkc_cf")]:
        full = os.path.join(tmp, name + "_full")
        extra = {"denormalization_rule_tsv": denorm} if name == "nfkc_cf" else {}
        spm.SentencePieceTrainer.train(
            **extra, input=corpus, model_prefix=full, vocab_size=1000, model_type="bpe", byte_fallback=True,
            normalization_rule_name=rule, character_coverage=0.98, user_defined_symbols=["<|im_end|>", "①②"],
            max_sentence_length=1 << 16, num_threads=1, minloglevel=2)
        proto = pb.ModelProto()
        proto.ParseFromString(open(full + ".model", "rb").read())
        hits = charsmap_hits(proto.normalizer_spec.precompiled_charsmap, lines)
        tsv = os.path.join(tmp, name + ".tsv")
        with open(tsv, "w") as f:
            for src, trg in sorted(hits.items()):
                hexes = lambda s: " ".join(f"{ord(c):X}" for c in s.decode("utf-8"))
                f.write(f"{hexes(src)}\t{hexes(trg)}\n")
        small = os.path.join(tmp, name + "_subset")
        spm.SentencePieceTrainer.train(
            input=corpus, model_prefix=small, vocab_size=300, model_type="char", normalization_rule_tsv=tsv,
            hard_vocab_limit=False, character_coverage=0.98, num_threads=1, minloglevel=2)
        sub = pb.ModelProto()
        sub.ParseFromString(open(small + ".model", "rb").read())
        proto.normalizer_spec.precompiled_charsmap = sub.normalizer_spec.precompiled_charsmap
        proto.normalizer_spec.name = rule + "_subset"
        model = os.path.join(out, name + ".model")
        with open(model, "wb") as f:
            f.write(proto.SerializeToString())
        ref = spm.SentencePieceProcessor(model_file=full + ".model")
        sp = spm.SentencePieceProcessor(model_file=model)
        proto.normalizer_spec.precompiled_charsmap = b""
        proto.normalizer_spec.name = "identity"
        ident = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
        ids = [sp.encode(l) for l in lines]
        assert ids == [ref.encode(l) for l in lines], f"{rule}: the subset charsmap changes ids"
        idents = [ident.encode(l) for l in lines]
        changed = sum(a != b for a, b in zip(ids, idents))
        assert changed >= len(lines) // 2, f"{rule}: only {changed} lines differ from identity"
        columns[name] = (ids, [sp.decode(i) for i in ids], idents)
        print(f"{rule}: {len(hits)} charsmap entries hit, {len(sub.normalizer_spec.precompiled_charsmap)} "
              f"bytes (full {len(ref.serialized_model_proto())} B model), {changed}/{len(lines)} lines differ "
              f"from identity, {os.path.getsize(model)} B")
    with open(os.path.join(out, "test.txt"), "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    # One row per line: for nfkc then nfkc_cf, the ids, the decode as UTF-8 hex, the ids
    # with the charsmap removed (identity normalization).
    with open(os.path.join(out, "expected.tsv"), "w") as f:
        for k in range(len(lines)):
            row = []
            for name in ("nfkc", "nfkc_cf"):
                ids, dec, idents = columns[name]
                row += [" ".join(map(str, ids[k])), dec[k].encode("utf-8").hex(), " ".join(map(str, idents[k]))]
            f.write("\t".join(row) + "\n")


if __name__ == "__main__":
    main()
