#!/usr/bin/env python3
"""Makes the byte-level BPE fixture of tests/unit/test_bpe_tokenizer.cpp with Hugging Face
`tokenizers` (offline, deterministic):

  python scripts/make_bpe_fixture.py [--out tests/fixtures/bpe] [--corpus /tmp/bpe_corpus.txt]

1. A training corpus of ~1.2 MB: the license texts in /usr/share/common-licenses (Debian)
   plus generated lines from a fixed seed: words of several scripts (Latin with accents,
   Greek, Cyrillic, CJK, Arabic, Devanagari, emoji), numbers of every length, runs of
   spaces / tabs / CR LF / NBSP / ideographic spaces, contractions, and special tokens
   between documents. Written to --corpus (not committed; regenerated the same).
2. A byte-level BPE (GPT-2 pre-tokenizer, vocab 3000, special tokens) trained on it:
   tokenizer.json.
3. test.txt (~150 KB, built the same way from another seed plus edge cases) and the ids
   `tokenizers` gives for it under each variant of variants.json (the same model with
   the GPT-2, Llama 3 or Qwen2 pre-tokenizer, prefix space, ignore_merges, a
   TemplateProcessing post-processor): expected_<variant>.u16 (uint16 little-endian).
"""
import argparse
import copy
import glob
import json
import os
import random
import struct

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")

SCRIPTS = {
    "latin": "abcdefghijklmnopqrstuvwxyzàáâäæçèéêëìíîïñòóôöøùúûüýÿßœ",
    "LATIN": "ABCDEFGHIJKLMNOPQRSTUVWXYZÀÉÎÖÜÇÑ",
    "greek": "αβγδεζηθικλμνξοπρστυφχψωάέήίόύώ",
    "cyrillic": "абвгдеёжзийклмнопрстуфхцчшщъыьэюя",
    "cjk": "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
    "kana": "あいうえおかきくけこさしすせそたちつてとなにぬねのアイウエオカキクケコ",
    "arabic": "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "devanagari": "कखगघङचछजझञटठडढणतथदधनपफबभमयरलवशषसहािीुूेैोौं",
    "hangul": "가나다라마바사아자차카타파하한국어",
}
EMOJI = "😀😂🤖🚀🌍✨🔥👍🏽❤️"
PUNCT = list(".,;:!?()[]{}\"'-–—…/\\@#$%^&*+=<>|~`") + ["...", "--", "->", "=>", "::"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", " \t ", "\n", "\r\n", "\n\n", "  \n", "\u00a0", "\u3000", " \u2009 ", "\u2028"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ll", "'D"]


def license_text():
    parts = []
    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(p) and not os.path.islink(p):
            with open(p, encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
    return parts


def gen_doc(rng, words):
    out = []
    for _ in range(rng.randint(20, 200)):
        r = rng.random()
        if r < 0.45:
            w = rng.choice(words)
        elif r < 0.65:
            s = SCRIPTS[rng.choice(list(SCRIPTS))]
            w = "".join(rng.choice(s) for _ in range(rng.randint(1, 9)))
        elif r < 0.75:
            n = rng.choice([1, 1, 2, 3, 4, 5, 7, 10, 16])
            w = "".join(rng.choice("0123456789") for _ in range(n))
            if rng.random() < 0.2:
                w += rng.choice([".", ",", "%", "th", "²", "½", "٣", "४"]) + str(rng.randint(0, 999))
        elif r < 0.82:
            w = rng.choice(PUNCT)
        elif r < 0.86:
            w = rng.choice(words) + rng.choice(CONTRACTIONS)
        elif r < 0.88:
            w = rng.choice(EMOJI)
        else:
            w = rng.choice(words).capitalize()
        out.append(w)
        out.append(rng.choice(SPACES) if rng.random() < 0.15 else " ")
    return "".join(out)


def build(seed, target_bytes, licenses, with_licenses=True):
    rng = random.Random(seed)
    words = " ".join(licenses).split()
    docs, size = [], 0
    lic = list(licenses) if with_licenses else []
    while size < target_bytes:
        if lic and rng.random() < 0.3:
            d = lic.pop(0)
        else:
            d = gen_doc(rng, words)
        docs.append(d)
        size += len(d.encode())
    sep = [rng.choice(SPECIALS[:3]) for _ in docs]
    return "".join(d + s for d, s in zip(docs, sep))


EDGE = ("Edge cases: it's IT'S it'S they'll we'VE I'm you'd 'ſ 'ſtrange x'ſ  \n"
        "trailing spaces   \n\n\n   leading\ttabs\t\t\n\r\n\r\nCR LF\r\n"
        "digits 1 12 123 1234 12345 1234567890 3.14159 1,000,000 ²³ ½ Ⅻ ٣٤٥ ४५६\n"
        "mixed: abc123def 123abc ABC\u00a0DEF\u3000全角　空白 tab\tend\n"
        "<|endoftext|><|im_start|>user\nhi<|im_end|><pad><pad>  <|endoftext|>  x<|endoftext|>y\n"
        "unicode: naïve café Ωμέγα Привет мир 你好，世界 こんにちは 안녕하세요 مرحبا नमस्ते 😀🤖 🏽 e\u0301\n"
        "punct: ... -- --> => :: !!! ??? ((( ))) \"quoted\" 'single' `tick` #tag @user $5 100% a/b\\c\n"
        "     \n\t \n \u2028 \u2029 end")


def variants(base):
    """Same vocab and merges; the pre-tokenizer (and a few model and processor keys) differ."""
    split = lambda pat: {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pat}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    tmpl = {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [base.token_to_id("<|im_start|>")],
                                                "tokens": ["<|im_start|>"]}}}
    return {
        "gpt2": {"add_special_tokens": False},
        "gpt2_prefix_space": {"add_special_tokens": False, "pre_tokenizer": {
            "type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}},
        "llama3": {"add_special_tokens": True, "pre_tokenizer": split(LLAMA3), "post_processor": tmpl,
                   "ignore_merges": True},
        "qwen2": {"add_special_tokens": False, "pre_tokenizer": split(QWEN2)},
    }


def apply_variant(tok_json, v):
    j = copy.deepcopy(tok_json)
    for k in ("pre_tokenizer", "post_processor"):
        if k in v:
            j[k] = v[k]
    if "ignore_merges" in v:
        j["model"]["ignore_merges"] = v["ignore_merges"]
    return j


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/bpe")
    ap.add_argument("--corpus", default="/tmp/bpe_corpus.txt")
    ap.add_argument("--vocab", type=int, default=3000)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    licenses = license_text()
    corpus = build(17, 1_200_000, licenses)
    with open(a.corpus, "w", encoding="utf-8", newline="") as f:
        f.write(corpus)
    print(f"corpus: {len(corpus.encode())} bytes -> {a.corpus}")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    docs = corpus.split("<|endoftext|>")
    tok.train_from_iterator(docs, trainer=trainer)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    tok_json = json.loads(tok.to_str())

    # The test text: licenses excluded (so it is not all training text), another seed.
    test = EDGE + "<|endoftext|>" + build(99, 150_000, licenses, with_licenses=False)[:150_000] + "\n" + EDGE
    with open(os.path.join(a.out, "test.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(test)
    vs = variants(tok)
    raw = test.encode()
    for name, v in vs.items():
        t = Tokenizer.from_str(json.dumps(apply_variant(tok_json, v)))
        # The other variants take the text's first ~60 KB (ending at a line end) to keep the fixture small.
        text = test if name == "gpt2" else raw[:raw.index(b"\n", 60_000) + 1].decode()
        v["text_bytes"] = len(text.encode())
        ids = t.encode(text, add_special_tokens=v["add_special_tokens"]).ids
        assert max(ids) < 65536
        if name == "gpt2":
            assert t.decode(ids, skip_special_tokens=False) == text
        with open(os.path.join(a.out, f"expected_{name}.u16"), "wb") as f:
            f.write(struct.pack(f"<{len(ids)}H", *ids))
        print(f"{name}: {len(ids)} ids for {v['text_bytes']} bytes")
    with open(os.path.join(a.out, "variants.json"), "w") as f:
        json.dump(vs, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
