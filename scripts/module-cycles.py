#!/usr/bin/env python3
"""Fails when sibling modules of a crate import each other in a circle, at any depth:
the top-level modules of cli/src (ARCHITECTURE.md: config and control at the bottom,
then host, services and notun, then daemon, then commands), of peers/src (state types
and codecs below `node`), of datapath/src, and the modules inside each directory
module (datapath/src/transport's links, udp and egress, peers/src/node's files).

A reference is any `crate::a::b` or `super::a` path outside comments, `use` groups
(`use crate::{a, b}`, `use super::{a, b}`) included. A module that refers to one of
its own ancestors or descendants is not an edge (a parent declares its children and
they take its items); two siblings (or their descendants) that refer to each other,
directly or round a longer circle, are.

    scripts/module-cycles.py [SRC_DIR ...]   (default: cli/src peers/src datapath/src)
"""
import os
import re
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
dirs = sys.argv[1:] or [os.path.join(root, d) for d in ("cli/src", "peers/src", "datapath/src")]


def module_of(src, path):
    """The module path of file `path` under crate root `src`: a list of names."""
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return rel


def targets(mod, is_dir_module, code):
    """Module paths the line `code` of module `mod` refers to."""
    out = []
    for m in re.finditer(r"\bcrate::((?:\w+::)*\w+)", code):
        out.append(m.group(1).split("::"))
    for m in re.finditer(r"\buse crate::\{([^}]*)", code):
        out += [[n] for n in re.findall(r"\b(\w+)\b", m.group(1))]
    # `super::` from a file is its parent module's sibling; from a mod.rs, the
    # directory's parent.
    base = mod if is_dir_module else mod[:-1]
    for m in re.finditer(r"\b((?:super::)+)((?:\w+::)*\w+)", code):
        ups = m.group(1).count("super::")
        here = base[: len(base) - ups + 1] if ups > 1 else base
        here = mod[: len(mod) - ups]
        out.append(here + m.group(2).split("::"))
    for m in re.finditer(r"\buse ((?:super::)+)\{([^}]*)", code):
        ups = m.group(1).count("super::")
        here = mod[: len(mod) - ups]
        out += [here + [n] for n in re.findall(r"\b(\w+)\b", m.group(2))]
    return out


def check(src):
    if not os.path.isdir(src):
        print(f"error: {src} is not a directory (expected a crate's source)", file=sys.stderr)
        sys.exit(2)
    files = {}
    for dirpath, _, names in os.walk(src):
        for f in names:
            if f.endswith(".rs"):
                p = os.path.join(dirpath, f)
                files[p] = module_of(src, p)
    modules = {tuple(m) for m in files.values()}
    # Every known module path, and the prefixes of each (directories).
    known = set()
    for m in modules:
        for i in range(len(m) + 1):
            known.add(m[:i])
    edges = {}  # parent dir -> {child: {child: where}}
    for p, mod in files.items():
        is_dir_module = os.path.basename(p) in ("mod.rs", "lib.rs", "main.rs")
        in_tests = False
        for n, line in enumerate(open(p, encoding="utf-8"), 1):
            if line.startswith("#[cfg(test)]"):
                in_tests = True
            if in_tests:
                continue
            code = line.split("//", 1)[0]
            for t in targets(mod, is_dir_module, code):
                # The longest known module prefix of the reference.
                t = tuple(t)
                while t and t not in known:
                    t = t[:-1]
                a = tuple(mod)
                if not t or a[: len(t)] == t or t[: len(a)] == a:
                    continue
                i = 0
                while a[i] == t[i]:
                    i += 1
                parent = a[:i]
                edges.setdefault(parent, {}).setdefault(a[i], {}).setdefault(t[i], f"{os.path.relpath(p, src)}:{n}")
    found = False
    for parent, g in sorted(edges.items()):
        nodes = set(g) | {w for v in g.values() for w in v}
        index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in g.get(v, {}):
                if w not in index:
                    visit(w)
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
                    comps.append(sorted(comp))

        for v in sorted(nodes):
            if v not in index:
                visit(v)
        where = "::".join(parent) or "the crate root"
        for c in comps:
            found = True
            print(f"import cycle in {os.path.normpath(src)} ({where}): {' <-> '.join(c)}", file=sys.stderr)
            for a in c:
                for b, at in sorted(g.get(a, {}).items()):
                    if b in c:
                        print(f"  {a} -> {b} ({at})", file=sys.stderr)
    if not found:
        count = len([m for m in known if len(m) >= 1])
        print(f"no import cycle between sibling modules of {os.path.normpath(src)} ({count} modules)")
    return found


bad = [check(d) for d in dirs]
sys.exit(1 if any(bad) else 0)
