#!/usr/bin/env python3
"""Checks every relative link in the repository's Markdown files.

For each *.md file (outside .git, target/, third_party/ and fuzz corpora), every
inline link or image `[text](dest)` and every reference definition `[id]: dest`
whose destination is relative (no scheme, not mailto:) must name a file or
directory that exists; a `#anchor` (alone or after a .md path) must match a heading
of that file, slugged as GitHub does (lowercase, punctuation dropped, spaces to
hyphens, repeats numbered -1, -2, ...) or an explicit <a id="..."> / <a name="...">.
Links inside code spans and fenced code blocks are ignored.

Exits 1 naming each broken link as FILE:LINE: DEST: why, 0 when all resolve.
Usage: scripts/check-links.py [ROOT]   (default: the repository root)
"""

import os
import re
import sys
from urllib.parse import unquote

SKIP_DIRS = {".git", "target", "third_party", "node_modules"}
SKIP_PATHS = ("fuzz/corpus", "core/fuzz/corpus", "peers/fuzz/corpus")

INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
FENCE = re.compile(r"^\s{0,3}(```+|~~~+)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def markdown_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in SKIP_DIRS and not os.path.join(rel, d).lstrip("./").startswith(SKIP_PATHS)
        )
        for name in sorted(filenames):
            if name.endswith(".md"):
                yield os.path.join(dirpath, name)


def lines_outside_code(text, blank_spans=True):
    """(line number, line) for lines outside fenced blocks, code spans blanked unless told."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            mark = m.group(1)
            if fence is None:
                fence = mark[0] * 3
                continue
            if mark.startswith(fence):
                fence = None
                continue
        if fence is None:
            yield n, CODE_SPAN.sub("", line) if blank_spans else line


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"<[^>]+>", "", heading)  # inline HTML
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits, _ (and non-ASCII letters)
    return text.replace(" ", "-")


_anchor_cache = {}


def anchors(path):
    if path not in _anchor_cache:
        found, seen = set(), {}
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for _, line in lines_outside_code(text, blank_spans=False):
            m = HEADING.match(line)
            if m:
                s = slug(m.group(2))
                n = seen.get(s, 0)
                seen[s] = n + 1
                found.add(s if n == 0 else f"{s}-{n}")
        for m in HTML_ID.finditer(text):
            found.add(m.group(1))
        _anchor_cache[path] = found
    return _anchor_cache[path]


def check(root):
    broken = []
    for md in markdown_files(root):
        with open(md, encoding="utf-8") as f:
            text = f.read()
        for n, line in lines_outside_code(text):
            dests = [m.group(1) for m in INLINE.finditer(line)]
            m = REFDEF.match(line)
            if m:
                dests.append(m.group(1))
            for dest in dests:
                why = resolve(md, dest)
                if why:
                    broken.append(f"{os.path.relpath(md, root)}:{n}: {dest}: {why}")
    return broken


def resolve(md, dest):
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", dest) or dest.startswith("//"):
        return None  # absolute URL, mailto:, ...
    path, _, anchor = dest.partition("#")
    path = unquote(path)
    target = md if path == "" else os.path.normpath(os.path.join(os.path.dirname(md), path))
    if path.startswith("/"):
        return "absolute path (use a relative one)"
    if not os.path.exists(target):
        return "no such file"
    if anchor and target.endswith(".md") and os.path.isfile(target):
        if unquote(anchor) not in anchors(target):
            return f"no heading #{anchor} in {os.path.basename(target)}"
    return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    root = os.path.abspath(root)
    broken = check(root)
    for b in broken:
        print(f"broken link: {b}", file=sys.stderr)
    if broken:
        print(f"{len(broken)} broken relative link(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
