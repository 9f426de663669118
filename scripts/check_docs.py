#!/usr/bin/env python3
"""Checks that the documentation points at things that exist.

Usage: python3 scripts/check_docs.py [REPO_ROOT]

Reads README.md, docs/*.md, bench/anchors/README.md, bench/results/*/README.md (and
bench/results/*.md) and scripts/device/README.md, and reports
  - a relative markdown link or image whose file does not exist,
  - a link to `FILE.md#anchor` (or `#anchor`) whose anchor is no heading of FILE.md,
  - a path `scripts/...sh|py` named in the text that does not exist, or (in bench/ and
    scripts/device/) a bare `NAME.sh` that is not in scripts/device/ or scripts/,
  - a script in scripts/device/ that scripts/device/README.md does not describe.
Exits 1 when anything is wrong (one line per problem: file:line: what), 0 otherwise.
Python 3 standard library only.
"""
import glob
import os
import re
import sys

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
SCRIPT = re.compile(r"(?<![\w./-])(scripts/[\w./-]+\.(?:sh|py))\b")
BARE_SH = re.compile(r"(?<![\w./-])([\w-]+\.sh)\b")  # a device script named without its folder
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")


def doc_files(root):
    pats = ["README.md", "docs/*.md", "bench/anchors/README.md", "bench/results/*.md",
            "bench/results/*/README.md", "scripts/device/README.md"]
    out = []
    for p in pats:
        out += sorted(glob.glob(os.path.join(root, p)))
    return out


def lines_outside_fences(text):
    """(line number, line) for every line that is not inside a fenced code block."""
    inside = False
    for i, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield i, line


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    h = re.sub(r"`|\*\*|__", "", heading.strip()).lower()
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h)  # a link in a heading keeps its text
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, names = {}, set()
        with open(path, encoding="utf-8") as f:
            for _, line in lines_outside_fences(f.read()):
                m = HEADING.match(line)
                if not m:
                    continue
                s = slug(m.group(1))
                n = seen.get(s, 0)
                seen[s] = n + 1
                names.add(s if n == 0 else f"{s}-{n}")
        cache[path] = names
    return cache[path]


def check_link(root, doc, lineno, target, problems):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
        return
    path, _, anchor = target.partition("#")
    if path.startswith("/"):
        problems.append(f"{os.path.relpath(doc, root)}:{lineno}: absolute link {target} (use a relative one)")
        return
    dest = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
    rel = os.path.relpath(dest, root)
    if rel.startswith(".."):
        problems.append(f"{os.path.relpath(doc, root)}:{lineno}: link {target} leaves the repository")
        return
    if not os.path.exists(dest):
        problems.append(f"{os.path.relpath(doc, root)}:{lineno}: link {target}: {rel} does not exist")
        return
    if anchor and dest.endswith(".md") and os.path.isfile(dest) and anchor not in anchors(dest):
        problems.append(f"{os.path.relpath(doc, root)}:{lineno}: link {target}: no heading "
                        f"#{anchor} in {rel}")


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    problems = []
    docs = doc_files(root)
    for doc in docs:
        with open(doc, encoding="utf-8") as f:
            text = f.read()
        for lineno, line in lines_outside_fences(text):
            m = REF_DEF.match(line)
            if m:
                check_link(root, doc, lineno, m.group(1), problems)
            no_code = re.sub(r"`[^`]*`", "", line)
            for m in LINK.finditer(no_code):
                check_link(root, doc, lineno, m.group(1), problems)
        rel_doc = os.path.relpath(doc, root)
        for lineno, line in enumerate(text.splitlines(), 1):  # code included: commands
            for m in SCRIPT.finditer(line):
                if not os.path.exists(os.path.join(root, m.group(1))):
                    problems.append(f"{rel_doc}:{lineno}: {m.group(1)} does not exist")
            if rel_doc.startswith(("bench/", "scripts/device/")):
                for m in BARE_SH.finditer(line):
                    name = m.group(1)
                    if not any(os.path.exists(os.path.join(root, d, name))
                               for d in ("scripts/device", "scripts")):
                        problems.append(f"{rel_doc}:{lineno}: {name}: no such script in scripts/device/")

    device = os.path.join(root, "scripts", "device")
    index = os.path.join(device, "README.md")
    if os.path.isdir(device):
        listed = open(index, encoding="utf-8").read() if os.path.exists(index) else ""
        for s in sorted(os.listdir(device)):
            if s.endswith((".sh", ".py")) and f"`{s}`" not in listed:
                problems.append(f"scripts/device/README.md: {s} is not described")

    for p in problems:
        print(p)
    print(f"check_docs: {len(docs)} files, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
