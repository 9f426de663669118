#!/usr/bin/env python3
"""Makes the normalizer fixture of tests/unit/test_bpe_tokenizer.cpp
(BpeNormalizer.IdsEqualHuggingFaceForEveryForm) with Hugging Face `tokenizers`
(offline, deterministic; needs the BPE fixture of scripts/make_bpe_fixture.py):

  python scripts/make_bpe_normalizer_fixture.py [--dir tests/fixtures/bpe]

Input text, normalize.txt: the first 20 000 characters of test.txt (composed text: accented
Latin, Greek, Cyrillic, CJK, Hangul, ...), the same characters in NFD (so composition
has everywhere to do), and the edge cases of EDGE (decomposed e + U+0301, Hangul
conjoining jamo, canonical reordering of combining marks, singletons such as the Angstrom
and Ohm signs, compatibility characters for NFKC/NFKD, combining marks after a special
token, and the two added tokens of ADDED).
For each normalizer of FORMS, the fixture's tokenizer.json with that normalizer and the
ADDED tokens encodes normalize.txt (add_special_tokens false): expected_norm_<name>.u16
(uint16 little-endian), and normalizers.json records the forms, the added tokens, and
each edge case's normalized text (`normalize_str`).
"""
import argparse
import json
import os
import struct
import unicodedata

import tokenizers
from tokenizers import Tokenizer

FORMS = {
    "nfc": {"type": "NFC"},
    "nfd": {"type": "NFD"},
    "nfkc": {"type": "NFKC"},
    "nfkd": {"type": "NFKD"},
    "seq_nfkd_nfc": {"type": "Sequence", "normalizers": [{"type": "NFKD"}, {"type": "NFC"}]},
}
# A normalized added token with a compatibility character (matched as "fix" under NFKC),
# and a non-normalized one holding a decomposed e (matched on the raw text, before NFC).
ADDED = [
    {"id": 3000, "content": "\ufb01x", "single_word": False, "lstrip": False, "rstrip": False,
     "normalized": True, "special": False},
    {"id": 3001, "content": "e\u0301!", "single_word": False, "lstrip": False, "rstrip": False,
     "normalized": False, "special": False},
]
EDGE = [
    "e\u0301",                                   # e + combining acute -> U+00E9 under NFC
    "Cafe\u0301 re\u0301sume\u0301 na\u0131\u0308ve",
    "\u1112\u1161\u11ab\u1100\u1173\u11af",      # Hangul conjoining jamo -> 한글
    "\ud55c\uad6d\uc5b4",                        # precomposed Hangul -> jamo under NFD
    "\u212b \u2126 \u212a",                      # Angstrom, Ohm, Kelvin signs: singletons
    "a\u0301\u0323 a\u0323\u0301 \u1e0b\u0323",  # canonical reordering of combining marks
    "\ufb01 \ufb02 \ufb00 \u2122 \u2026 \u00bd x\u00b2\u00b3 \u2460\u2461",  # NFKC only
    "\uff21\uff22\uff23\uff11\uff12\uff13 \uff76\uff80\uff76\uff85 \u3000\u00a0x \u337f \u01c5",
    "<|im_start|>\u0301x<|im_end|>\u0308",       # combining marks right after special tokens
    "\ufb01x fix e\u0301! \u00e9!",               # the ADDED tokens, raw and normalized
    "\u0041\u030a\u0301 \u00c5\u0301 \u1e9b\u0323",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "bpe"))
    a = ap.parse_args()
    base = json.load(open(os.path.join(a.dir, "tokenizer.json"), encoding="utf-8"))
    test = open(os.path.join(a.dir, "test.txt"), encoding="utf-8").read()[:20000]
    text = test + "\n" + unicodedata.normalize("NFD", test) + "\n" + "\n".join(EDGE) + "\n"
    with open(os.path.join(a.dir, "normalize.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(text)
    out = {"tokenizers": tokenizers.__version__, "added_tokens": ADDED, "forms": {}}
    for name, norm in FORMS.items():
        j = json.loads(json.dumps(base))
        j["normalizer"] = norm
        j["added_tokens"] = j["added_tokens"] + ADDED
        tok = Tokenizer.from_str(json.dumps(j))
        ids = tok.encode(text, add_special_tokens=False).ids
        with open(os.path.join(a.dir, f"expected_norm_{name}.u16"), "wb") as f:
            f.write(struct.pack(f"<{len(ids)}H", *ids))
        n = tok.normalizer
        out["forms"][name] = {"normalizer": norm, "ids": len(ids),
                              "edge_normalized": [n.normalize_str(e) for e in EDGE],
                              "edge_ids": [tok.encode(e, add_special_tokens=False).ids for e in EDGE]}
        print(name, len(ids), "ids")
    out["edge"] = EDGE
    with open(os.path.join(a.dir, "normalizers.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, indent=1)


if __name__ == "__main__":
    main()
