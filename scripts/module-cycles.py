#!/usr/bin/env python3
"""Fails when the daemon's top-level modules (cli/src/<module>) import each other in a
circle (ARCHITECTURE.md: config and control at the bottom, then host, services and
notun, then daemon, then commands). A reference is any `crate::<module>` path outside
comments, `use crate::{...}` groups included.

    scripts/module-cycles.py [SRC_DIR]      (default cli/src)
"""
import os
import re
import sys

src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "cli", "src")
if not os.path.isdir(src):
    print(f"error: {src} is not a directory (expected the daemon's source, cli/src)", file=sys.stderr)
    sys.exit(2)
mods = sorted(
    n[:-3] if n.endswith(".rs") else n
    for n in os.listdir(src)
    if (n.endswith(".rs") and n not in ("main.rs", "lib.rs")) or os.path.isdir(os.path.join(src, n))
)
edges = {m: {} for m in mods}
for dirpath, _, files in os.walk(src):
    for f in files:
        if not f.endswith(".rs"):
            continue
        path = os.path.join(dirpath, f)
        top = os.path.relpath(path, src).split(os.sep)[0].removesuffix(".rs")
        if top not in edges:
            continue
        for n, line in enumerate(open(path, encoding="utf-8"), 1):
            code = line.split("//", 1)[0]
            names = re.findall(r"crate::(\w+)", code)
            group = re.search(r"use crate::\{(.*)", code)
            if group:
                names += re.findall(r"\b(\w+)\b", group.group(1))
            for t in names:
                if t in edges and t != top:
                    edges[top].setdefault(t, f"{os.path.relpath(path, src)}:{n}")

# Tarjan's strongly connected components.
index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]
def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in edges[v]:
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
for m in mods:
    if m not in index:
        visit(m)
if comps:
    for c in comps:
        print(f"import cycle between cli modules: {' <-> '.join(c)}", file=sys.stderr)
        for a in c:
            for b, where in sorted(edges[a].items()):
                if b in c:
                    print(f"  {a} -> {b} ({where})", file=sys.stderr)
    sys.exit(1)
print(f"no import cycle between the {len(mods)} top-level modules of {os.path.normpath(src)}")
