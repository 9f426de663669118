#!/usr/bin/env python3
"""Puts each test file's code in a namespace of its own (zt_test_<file>), so the test
sources compile together in a unity build without their file-local helpers colliding.
A file whose code is in `namespace zt::X { ... }` gets `namespace test_<file>` inside it
instead. Idempotent: files that already have it are left alone.
  usage: scripts/wrap_test_namespace.py FILE...   (prints the files it changed)"""
import re, sys, pathlib

for arg in sys.argv[1:]:
    p = pathlib.Path(arg)
    stem = re.sub(r"\W", "_", p.stem.removeprefix("test_"))
    s = p.read_text()
    if f"namespace zt_test_{stem} {{" in s or f"namespace test_{stem} {{" in s:
        continue
    lines = s.split("\n")
    opens = [i for i, l in enumerate(lines) if re.fullmatch(r"namespace zt(::\w+)* \{", l)]
    closes = [i for i, l in enumerate(lines) if re.fullmatch(r"\}  // namespace zt(::\w+)*", l)]
    if len(opens) == 1 and len(closes) == 1 and opens[0] < closes[0]:
        lines.insert(closes[0], f"}}  // namespace test_{stem}")
        lines.insert(opens[0] + 1, f"namespace test_{stem} {{")
    else:
        last_inc = max(i for i, l in enumerate(lines) if l.startswith("#include"))
        while lines and lines[-1] == "":
            lines.pop()
        lines.insert(last_inc + 1, f"\nnamespace zt_test_{stem} {{")
        lines.append(f"\n}}  // namespace zt_test_{stem}")
        lines.append("")
    p.write_text("\n".join(lines))
    print(p)
