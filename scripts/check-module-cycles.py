#!/usr/bin/env python3
"""Fails when the modules of a crate import each other in a circle.

toolwarden keeps every crate's module graph one-way (ARCHITECTURE.md, "Architecture
invariants"): a module may use the modules below it, never one that uses it back. This script
reads a crate's `src/` as text and builds the graph from its paths:

- every file is a node (`src/lib.rs` is the crate root, `src/a.rs` and `src/a/mod.rs` are
  `crate::a`, `src/a/b.rs` is `crate::a::b`); inline modules belong to their file;
- an edge is a path that names another module: `crate::a::Item`, `super::Item`,
  `self::b::Item`, in `use` lines (braces expanded) and in code;
- `mod x;` is not an edge (declaring a child is not using it), and neither is the crate
  root's `pub use x::Item`: the root is the crate's facade. A path through the facade
  (`crate::Item` for a re-exported item) is an edge to the module that defines the item;
- any other `pub use x::Item` is an edge, like a `use`;
- `#[cfg(test)]` modules are left out (tests may look anywhere).

A binary with modules of its own (`src/bin/NAME/main.rs` and its files) is a crate of its own:
give its directory as a CRATE_SRC_DIR of its own.

Usage: check-module-cycles.py CRATE_SRC_DIR [...]; exits 1 and prints each circle, with the
lines that make it, when there is one.
"""

import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_path(src, file):
    rel = os.path.relpath(file, src)[: -len(".rs")].split(os.sep)
    if rel in (["lib"], ["main"]):
        return ()
    if rel[-1] == "mod":
        rel = rel[:-1]
    if len(rel) >= 2 and rel[0] == "bin":
        return None  # binaries are crates of their own
    return tuple(rel)


def strip_comments_and_strings(text):
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not re.match(r"[A-Za-z0-9_]", text[i - 1])):
            m = re.match(r'r(#*)"', text[i:])
            close = '"' + m.group(1)
            j = text.find(close, i + len(m.group(0)))
            j = n if j < 0 else j + len(close)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or text.startswith("'\\u{", i):
            j = text.find("'", i + 1)
            if text.startswith("'\\", i):
                j = text.find("'", i + 2)
            out.append("' '")
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(text, open_at):
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text)


def drop_test_modules(text):
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+" + IDENT + r"\s*\{", text)
        if not m:
            return text
        end = matching_brace(text, m.end() - 1)
        text = text[: m.start()] + "\n" * text.count("\n", m.start(), end + 1) + text[end + 1:]


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not m:
        return [tree]
    prefix, inner = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    return [p for part in parts if part for p in expand_use(prefix + part)]


def inline_module_spans(text):
    """(start, end, depth) of inline `mod x { ... }` blocks, to resolve `super::` inside them."""
    spans = []
    for m in re.finditer(r"\bmod\s+" + IDENT + r"\s*\{", text):
        spans.append((m.start(), matching_brace(text, m.end() - 1)))
    return spans


def references(text, children):
    """(offset, path) for every path that starts at crate/super/self or at a child module of
    this file (`child::Item`, as Rust allows since 2018), the latter as `self::child::Item`."""
    starts = ["crate", "super", "self"] + sorted(children)
    refs = []
    for m in re.finditer(r"\b(pub(\([^)]*\))?\s+)?use\s+([^;]+);", text):
        for path in expand_use(m.group(3)):
            path = re.sub(r"\bas\b.*$", "", path).lstrip(":")
            segs = path.split("::")
            if segs[0] in children:
                segs = ["self"] + segs
            refs.append((m.start(), segs))
    used = [(m.start(), m.end()) for m in re.finditer(r"\buse\s+[^;]+;", text)]
    pattern = r"(?<![A-Za-z0-9_:])((" + "|".join(starts) + r")(::" + IDENT + r")+)"
    for m in re.finditer(pattern, text):
        if any(a <= m.start() < b for a, b in used):
            continue
        segs = m.group(1).split("::")
        if segs[0] in children:
            segs = ["self"] + segs
        refs.append((m.start(), segs))
    return refs


def resolve(path, here, modules, inline_depth, facade):
    """The module node a path names, or None (outside the crate, or the same file)."""
    segs = list(path)
    if not segs:
        return None
    if segs[0] == "crate" and len(segs) > 1 and segs[1] in facade:
        return facade[segs[1]]
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = list(here)
        depth = inline_depth
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                if depth > 0:
                    depth -= 1
                elif base:
                    base.pop()
            segs = segs[1:]
        if depth > 0:
            return None  # inside an inline module of this very file
        base = tuple(base)
    else:
        return None
    best = base if base in modules else None
    cur = base
    for s in segs:
        cur = cur + (s,)
        if cur in modules:
            best = cur
    return best


def check(src):
    files = {}
    for root, _, names in os.walk(src):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(root, name)
                mod = module_path(src, path)
                if mod is not None:
                    files[mod] = path
    modules = set(files)
    # A `#[path = "..."] mod x;` in the root is a module whose file lies elsewhere (a file shared
    # by several binaries): a node of its own, whose file is checked where it lives.
    if () in files:
        with open(files[()], encoding="utf-8") as f:
            raw_root = f.read()
        for m in re.finditer(
            r"#\[path\s*=\s*\"[^\"]*\"\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;",
            raw_root,
        ):
            modules.add((m.group(1),))
    edges = {m: {} for m in modules}
    # The root's re-exports: item name -> the module that defines it.
    facade = {}
    facade_spans = []
    if () in files:
        with open(files[()], encoding="utf-8") as f:
            root = drop_test_modules(strip_comments_and_strings(f.read()))
        for m in re.finditer(r"\bpub(\([^)]*\))?\s+use\s+([^;]+);", root):
            facade_spans.append((m.start(), m.end()))
            for path in expand_use(m.group(2)):
                segs = re.sub(r"\bas\b.*$", "", path).lstrip(":").split("::")
                if segs[0] == "crate":
                    segs = segs[1:]
                target = resolve(["crate"] + segs, (), modules, 0, {})
                if target:
                    alias = re.search(r"\bas(" + IDENT + r")$", path)
                    facade[alias.group(1) if alias else segs[-1]] = target
    for mod, path in files.items():
        with open(path, encoding="utf-8") as f:
            raw = f.read()
        text = drop_test_modules(strip_comments_and_strings(raw))
        spans = inline_module_spans(text)
        children = {m[-1] for m in modules if len(m) == len(mod) + 1 and m[: len(mod)] == mod}
        for offset, segs in references(text, children):
            if mod == () and any(a <= offset < b for a, b in facade_spans):
                continue
            depth = sum(1 for a, b in spans if a < offset < b)
            target = resolve(segs, mod, modules, depth, facade)
            if target is None or target == mod:
                continue
            # A child naming its own ancestors' items is an edge; a path through an ancestor to a
            # sibling is an edge to the sibling (resolve already picked the longest module).
            line = text.count("\n", 0, offset) + 1
            edges[mod].setdefault(target, f"{os.path.relpath(path)}:{line}")
    return files, edges


def cycles(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def name(mod):
    return "crate" if not mod else "crate::" + "::".join(mod)


def main(dirs):
    failed = False
    for src in dirs:
        files, edges = check(src)
        for comp in cycles(edges):
            failed = True
            members = set(comp)
            print(f"{src}: modules import each other in a circle: {', '.join(name(m) for m in comp)}")
            for m in comp:
                for t, where in sorted(edges[m].items()):
                    if t in members:
                        print(f"  {name(m)} -> {name(t)}  ({where})")
    if failed:
        print("Keep the module graph one-way: move what both sides need into a module below both.")
        return 1
    print(f"module graphs are one-way: {' '.join(dirs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["src"]))
