#!/usr/bin/env python3
"""Checks that every README code block tied to an example file matches that file.

In README.md, examples/pytorch/README.md and docs/*.md, a block introduced by
`<!-- snippet: examples/tour_publish.cpp -->` (any fence language: cpp, python, sh) must equal the
text between `// [snippet]` and `// [/snippet]` (`# [snippet]` and `# [/snippet]` in Python and
shell files) in that file (dedented), or the whole file when it has no such region. The files
are compiled and run by CTest or by tests/pytorch/run.sh, so the READMEs' examples cannot rot.
Exit 1 names each mismatch.

    check_readme_snippets.py ROOT [MIN_BLOCKS]
"""
import pathlib
import re
import sys
import textwrap

root = pathlib.Path(sys.argv[1])
pages = [root / "README.md", root / "examples" / "pytorch" / "README.md"]
pages += sorted((root / "docs").glob("*.md"))
pattern = re.compile(r"<!-- snippet: (\S+) -->\s*\n```\w*\n(.*?)```", re.S)
region = re.compile(r"(?://|#) \[snippet\]\n(.*?)\n\s*(?://|#) \[/snippet\]", re.S)
found = 0
bad = []
for page in pages:
    if not page.exists():
        continue
    for path, block in pattern.findall(page.read_text()):
        found += 1
        source = (root / path).read_text()
        m = region.search(source)
        want = textwrap.dedent(m.group(1)).strip() if m else source.strip()
        if block.strip() != want:
            bad.append(f"{page.relative_to(root)}: the block for {path} differs from the file's "
                       f"snippet region")
expected = int(sys.argv[2]) if len(sys.argv) > 2 else 1
if found < expected:
    bad.append(f"{found} snippet blocks in the READMEs, expected at least {expected}")
for b in bad:
    print("readme snippets:", b)
print(f"readme snippets: {found} checked, {len(bad)} problems")
sys.exit(1 if bad else 0)
