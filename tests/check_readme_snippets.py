#!/usr/bin/env python3
"""Checks that every fenced code block of the documentation is tied to a file the build runs.

Pages: README.md, examples/pytorch/README.md and docs/*.md.

1. Every fenced block (```` ``` ```` or ```` ```lang ````, any language) must be introduced by a
   `<!-- snippet: PATH -->` or `<!-- snippet: PATH#NAME -->` line, the line right before the
   fence. A block without one is an error naming the page and line: an untied block cannot be
   added. (Text that no file can honestly hold, such as a layout tree, belongs in prose or a
   table, not in a fence.)

2. The block must equal (both dedented, surrounding blank lines ignored) the region of PATH:
   - `PATH#NAME`: the text between the lines `// [snippet NAME]` and `// [/snippet NAME]`
     (`#` instead of `//` in Python, shell, sbatch and CMake files);
   - `PATH`: the text between `// [snippet]` and `// [/snippet]` (or `#`), or the whole file
     when it has no such region.
   Marker lines of other regions nested inside a region are left out of it, so one file can
   show a whole tour in one guide and a part of it in another.

3. PATH must be a file that the build or the test run uses. Mechanically, PATH (relative to the
   repository root) is used when one of these holds:
   a. a *runner* names it: the runners are every CMakeLists.txt of the repository (outside
      build*/ and .git/), tests/run and tests/pytorch/run.sh, and, transitively, every file a
      runner names that is itself a script (`*.sh`, `*.py`, `*.cmake`, `*.sbatch`, or a file
      starting with `#!`); a runner *names* PATH when its text contains PATH relative to the
      repository root, or PATH relative to the runner's own directory (the form `dir/file`
      with at least one `/`, or a bare file name for a file in the runner's own directory);
   b. a CMakeLists.txt globs it: a `file(GLOB ...)` or `file(GLOB_RECURSE ...)` pattern in a
      CMakeLists.txt, with `${CMAKE_CURRENT_SOURCE_DIR}` read as that file's directory and
      `${PROJECT_SOURCE_DIR}` / `${CMAKE_SOURCE_DIR}` as the root, matches PATH
      (`fnmatch`; GLOB_RECURSE also matches below the pattern's directory).
   A tied file outside that set is an error: a block tied to a file nothing builds or runs can
   rot unseen.

4. At least MIN_BLOCKS blocks must be found (CMake passes the count the pages have, so deleting
   pages or blocks is noticed).

    check_readme_snippets.py ROOT [MIN_BLOCKS]
    check_readme_snippets.py --self-test

Exit 1 names each problem as `page:line: ...`. --self-test builds a small repository in a
temporary directory and checks that each rule above catches what it must (an untied block, a
tie to an unused file, a missing region, a changed block) and accepts a glob-matched file, a
script named by tests/run, a named region with a nested one, and a CMakeLists.txt named by its
directory.
"""
import fnmatch
import os
import pathlib
import re
import sys
import textwrap

import tempfile

root = pathlib.Path(".")  # set by check()
fence = re.compile(r"^ {0,3}(`{3,}|~{3,})")
marker = re.compile(r"^<!-- snippet: (\S+?)(?:#([\w.-]+))? -->\s*$")
any_marker = re.compile(r"^\s*(?://|#) \[/?snippet(?: [\w.-]+)?\]\s*$")
SCRIPT_SUFFIXES = {".sh", ".py", ".cmake", ".sbatch"}


def blocks(page):
    """Yields (line number of the fence, the marker line before it or None, the block text)."""
    lines = page.read_text().split("\n")
    i = 0
    while i < len(lines):
        m = fence.match(lines[i])
        if not m:
            i += 1
            continue
        start, ticks = i, m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].lstrip().startswith(ticks):
            j += 1
        before = lines[start - 1] if start > 0 else ""
        yield start + 1, before, "\n".join(lines[start + 1:j])
        i = j + 1


def region(text, name):
    """The region NAME of a file's text (None: the unnamed one, or the whole file), or None."""
    tag = r"\[snippet" + (" " + re.escape(name) if name else "") + r"\]"
    end = r"\[/snippet" + (" " + re.escape(name) if name else "") + r"\]"
    m = re.search(r"^[ \t]*(?://|#) " + tag + r"[ \t]*\n(.*?)^[ \t]*(?://|#) " + end, text,
                  re.S | re.M)
    if not m:
        return None if name else text
    body = [l for l in m.group(1).split("\n") if not any_marker.match(l)]
    return "\n".join(body)


def normal(text):
    return textwrap.dedent(text).strip("\n").rstrip()


def is_script(path):
    if path.suffix in SCRIPT_SUFFIXES or path.name == "CMakeLists.txt":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


def skip(path):
    parts = path.relative_to(root).parts
    return any(p == ".git" or p.startswith("build") for p in parts[:-1])


def expand(runner):
    """A runner's text as rule 3 reads it: CMake's foreach loops unrolled, directory variables
    replaced by absolute paths."""
    text = runner.read_text(errors="replace")
    if runner.name == "CMakeLists.txt" or runner.suffix == ".cmake":
        for var, items, body in re.findall(
                r"foreach\(\s*(\w+)\s+(?:IN\s+ITEMS\s+)?([^)]*)\)(.*?)endforeach", text, re.S):
            for item in items.split():
                text += "\n" + body.replace("${" + var + "}", item)
        text = (text.replace("${CMAKE_CURRENT_SOURCE_DIR}", str(runner.parent))
                .replace("${PROJECT_SOURCE_DIR}", str(root))
                .replace("${CMAKE_SOURCE_DIR}", str(root)))
    return text


def patterns(runner, text):
    """Rule 3b's glob patterns (absolute) in a runner: file(GLOB[_RECURSE] ...) in CMake files,
    words holding a `*` in shell and Python scripts (read from the root and from the runner's
    directory)."""
    out = []
    if runner.name == "CMakeLists.txt" or runner.suffix == ".cmake":
        for kind, pattern in re.findall(
                r"file\(\s*(GLOB_RECURSE|GLOB)\s+\S+\s+(?:CONFIGURE_DEPENDS\s+)?"
                r"(?:RELATIVE\s+\S+\s+)?(?:CONFIGURE_DEPENDS\s+)?\"?([^\")\s]+)", text):
            out.append((kind, pattern))
    else:
        for word in re.findall(r"[\w./-]*\*[\w./*-]*", text):
            if "/" in word:
                out.append(("GLOB", str(root / word)))
                out.append(("GLOB", os.path.normpath(str(runner.parent / word))))
    return out


def names(text, runner_dir, path):
    """Rule 3a: does a runner's (expanded) text name `path`? A CMakeLists.txt is named by its
    directory (as add_subdirectory and `cmake -S` name it)."""
    targets = [path]
    if path.name == "CMakeLists.txt":
        targets.append(path.parent)
    for t in targets:
        rel_dir = os.path.relpath(t, runner_dir)
        forms = [str(t), str(t.relative_to(root))]
        if not rel_dir.startswith("..") and rel_dir != ".":
            forms.append(rel_dir)
        for form in forms:
            if re.search(r"(?<![\w.-])" + re.escape(form) + r"(?![\w-])", text):
                return True
    return False


def globbed(path, pats):
    for kind, pattern in pats:
        if fnmatch.fnmatch(str(path), pattern):
            return True
        if kind == "GLOB_RECURSE":
            d, base = os.path.split(pattern)
            if str(path).startswith(d + os.sep) and fnmatch.fnmatch(path.name, base):
                return True
    return False


def used_files(candidates):
    """The candidates (absolute paths) that rule 3 counts as used."""
    start = {p for p in root.rglob("CMakeLists.txt") if not skip(p)}
    start |= {root / "tests" / "run", root / "tests" / "pytorch" / "run.sh"}
    start = {p for p in start if p.exists()}
    scripts = [p for p in root.rglob("*") if p.is_file() and not skip(p) and is_script(p)]
    runners = {}  # path -> (expanded text, glob patterns)
    frontier = list(start)
    while frontier:
        r = frontier.pop()
        if r in runners:
            continue
        text = expand(r)
        runners[r] = (text, patterns(r, text))
        # A script that a runner names or globs is a runner too (CMakeLists.txt files are
        # runners from the start: their text counts, whether or not they are themselves used).
        for s in scripts:
            if s not in runners and s.name != "CMakeLists.txt" and (
                    names(text, r.parent, s) or globbed(s, runners[r][1])):
                frontier.append(s)
    used = set()
    for c in candidates:
        if c in runners and c.name != "CMakeLists.txt":
            used.add(c)  # tests/run, tests/pytorch/run.sh, or a script one of them reaches
        elif any(names(t, r.parent, c) or globbed(c, pats)
                 for r, (t, pats) in runners.items() if r != c):
            used.add(c)
    return used


def check(repo, expected):
    """Checks the pages of `repo`; returns (blocks found, blocks tied, problems)."""
    global root
    root = pathlib.Path(repo).resolve()
    pages = [root / "README.md", root / "examples" / "pytorch" / "README.md"]
    pages += sorted((root / "docs").glob("*.md"))
    found = 0
    bad = []
    ties = []  # (page, line, path)
    for page in pages:
        if not page.exists():
            continue
        rel = page.relative_to(root)
        for line, before, block in blocks(page):
            found += 1
            m = marker.match(before)
            if not m:
                bad.append(f"{rel}:{line}: a fenced block without a `<!-- snippet: PATH[#NAME] -->` "
                           f"line right before it (tie it to a file the build or the tests run, or "
                           f"make it prose)")
                continue
            path, name = m.group(1), m.group(2)
            target = root / path
            if not target.is_file():
                bad.append(f"{rel}:{line}: {path} does not exist")
                continue
            want = region(target.read_text(), name)
            if want is None:
                bad.append(f"{rel}:{line}: {path} has no region `[snippet {name}]`")
                continue
            if normal(block) != normal(want):
                bad.append(f"{rel}:{line}: the block differs from {path}"
                           f"{'#' + name if name else ''}")
            ties.append((rel, line, target.resolve()))
    used = used_files({t for _, _, t in ties})
    for rel, line, target in ties:
        if target not in used:
            bad.append(f"{rel}:{line}: {target.relative_to(root)} is not used by the build or the "
                       f"tests (no CMakeLists.txt, tests/run, tests/pytorch/run.sh or script they "
                       f"run names it, and no CMake glob matches it)")
    if found < expected:
        bad.append(f"{found} blocks in the pages, expected at least {expected}")
    return found, len(ties), bad


def self_test():
    files = {
        "CMakeLists.txt": 'file(GLOB _t CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/ex/tour_*.cpp")\n'
                          "foreach(_k IN ITEMS one)\n  add_test(NAME c COMMAND x -S sub/${_k})\n"
                          "endforeach()\n",
        "sub/one/CMakeLists.txt": "# [snippet use]\nfind_package(x)\n# [/snippet use]\n",
        "tests/run": "#!/bin/sh\nbash tools/go.sh\n",
        "tools/go.sh": "# [snippet]\necho go\n# [/snippet]\n",
        "ex/tour_a.cpp": "int main() {\n  // [snippet all]\n  int a = 1;\n  // [snippet part]\n"
                         "  a += 1;\n  // [/snippet part]\n  return a - 2;\n  // [/snippet all]\n}\n",
        "ex/dead.cpp": "int main() {}\n",
    }
    good = ("<!-- snippet: ex/tour_a.cpp#all -->\n```cpp\nint a = 1;\na += 1;\nreturn a - 2;\n```\n\n"
            "<!-- snippet: ex/tour_a.cpp#part -->\n```cpp\na += 1;\n```\n\n"
            "<!-- snippet: tools/go.sh -->\n```sh\necho go\n```\n\n"
            "<!-- snippet: sub/one/CMakeLists.txt#use -->\n```cmake\nfind_package(x)\n```\n")
    bad_page = ("```text\nuntied\n```\n\n<!-- snippet: ex/dead.cpp -->\n```cpp\nint main() {}\n```\n\n"
                "<!-- snippet: ex/tour_a.cpp#none -->\n```cpp\nx\n```\n\n"
                "<!-- snippet: ex/tour_a.cpp#part -->\n```cpp\na += 2;\n```\n")
    expect_bad = ["docs/bad.md:1: a fenced block without", "docs/bad.md:6: ex/dead.cpp is not used",
                  "docs/bad.md:11: ex/tour_a.cpp has no region", "docs/bad.md:16: the block differs"]
    failures = []
    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            (pathlib.Path(d) / name).parent.mkdir(parents=True, exist_ok=True)
            (pathlib.Path(d) / name).write_text(text)
        (pathlib.Path(d) / "README.md").write_text(good)
        found, tied, bad = check(d, 4)
        if bad or (found, tied) != (4, 4):
            failures.append(f"the good page: {found} blocks, {tied} tied, problems {bad}")
        (pathlib.Path(d) / "docs").mkdir()
        (pathlib.Path(d) / "docs" / "bad.md").write_text(bad_page)
        found, tied, bad = check(d, 99)
        for want in expect_bad + ["blocks in the pages, expected at least 99"]:
            if not any(want in b for b in bad):
                failures.append(f"not reported: {want!r} (reported: {bad})")
        if len(bad) != len(expect_bad) + 1:
            failures.append(f"{len(bad)} problems reported, expected {len(expect_bad) + 1}: {bad}")
    for f in failures:
        print("readme snippets self-test:", f)
    print(f"readme snippets self-test: {'FAILED' if failures else 'passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    found, tied, bad = check(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    for b in bad:
        print("readme snippets:", b)
    print(f"readme snippets: {found} blocks, {tied} tied, {len(bad)} problems")
    sys.exit(1 if bad else 0)
