#!/usr/bin/env python3
"""Checks that every README code block tied to an example file matches that file.

In README.md, a block introduced by `<!-- snippet: examples/tour_publish.cpp -->` must equal the
text between `// [snippet]` and `// [/snippet]` in that file (dedented), or the whole file when
it has no such region. The example files are
compiled and run by CTest, so the README's examples cannot rot. Exit 1 names each mismatch.
"""
import pathlib
import re
import sys
import textwrap

root = pathlib.Path(sys.argv[1])
readme = (root / "README.md").read_text()
pattern = re.compile(r"<!-- snippet: (\S+) -->\s*\n```cpp\n(.*?)```", re.S)
found = 0
bad = []
for path, block in pattern.findall(readme):
    found += 1
    source = (root / path).read_text()
    m = re.search(r"// \[snippet\]\n(.*?)\n\s*// \[/snippet\]", source, re.S)
    want = textwrap.dedent(m.group(1)).strip() if m else source.strip()
    if block.strip() != want:
        bad.append(f"README.md block for {path} differs from the file's snippet region")
expected = int(sys.argv[2]) if len(sys.argv) > 2 else 1
if found < expected:
    bad.append(f"README.md has {found} snippet blocks, expected at least {expected}")
for b in bad:
    print("readme snippets:", b)
print(f"readme snippets: {found} checked, {len(bad)} problems")
sys.exit(1 if bad else 0)
