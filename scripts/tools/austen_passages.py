"""Jane Austen's six novels, from the R package janeaustenr's data file, as
passages of text labelled by novel: a CSV of `text,novel` per split.

    python austen_passages.py Rdata.rdb OUT_DIR

Rdata.rdb is R's lazy-load database: zlib blocks, each a 4-byte big-endian
length then the compressed serialization (XDR) of one object; each novel
is a character vector of its lines. Paragraphs after the first chapter
heading are cut into passages of whole sentences, about 30 words or more
each (a paragraph's last one 12 or more). The last 15% of each novel's
passages are `test.csv`, the rest `train.csv`, each shuffled (seed 1).
"""
import csv
import random
import re
import struct
import sys
import zlib

NOVELS = {
    "EMMA": "emma",
    "MANSFIELD PARK": "mansfield_park",
    "NORTHANGER ABBEY": "northanger_abbey",
    "Persuasion": "persuasion",
    "PRIDE AND PREJUDICE": "pride_and_prejudice",
    "SENSE AND SENSIBILITY": "sense_and_sensibility",
}


def blocks(b):
    i = 0
    while i < len(b):
        n = struct.unpack(">I", b[i:i + 4])[0]
        d = zlib.decompressobj()
        out = d.decompress(b[i + 4:])
        assert len(out) == n, "a block of another length than its header says"
        yield out
        i = len(b) - len(d.unused_data)


def strings(o):
    """The strings of a serialized character vector, or None."""
    assert o[:2] == b"X\n", "not an XDR serialization"
    p = 2
    version, = struct.unpack(">i", o[p:p + 4])
    p += 12
    if version == 3:
        n, = struct.unpack(">i", o[p:p + 4])
        p += 4 + n
    flags, = struct.unpack(">i", o[p:p + 4])
    p += 4
    if flags & 0xFF != 16:  # STRSXP
        return None
    n, = struct.unpack(">i", o[p:p + 4])
    p += 4
    out = []
    for _ in range(n):
        length, = struct.unpack(">i", o[p + 4:p + 8])
        p += 8
        out.append("" if length < 0 else o[p:p + length].decode("utf-8"))
        p += max(length, 0)
    return out


def sentences(paragraph):
    pieces = re.split(r"(?<=[.!?\"'])\s+(?=[\"'A-Z])", paragraph.replace("_", ""))
    out = []
    for s in pieces:
        if out and re.search(r"\b(Mr|Mrs|Dr|St|Col|Capt)\.$", out[-1]):
            out[-1] += " " + s
        else:
            out.append(s)
    return out


def passages(lines):
    paragraphs, current, started = [], [], False
    for line in lines + [""]:
        line = line.strip()
        if re.match(r"^(CHAPTER|Chapter)\b", line):
            started, current = True, []
        elif line:
            current.append(line)
        else:
            if current and started:
                paragraphs.append(" ".join(current))
            current = []
    out = []
    for p in paragraphs:
        chunk = []
        for s in sentences(p):
            chunk.append(s)
            if sum(len(c.split()) for c in chunk) >= 30:
                out.append(" ".join(chunk))
                chunk = []
        if sum(len(c.split()) for c in chunk) >= 12:
            out.append(" ".join(chunk))
    return out


def main():
    rdb, out = sys.argv[1], sys.argv[2]
    rows = {"train": [], "test": []}
    for block in blocks(open(rdb, "rb").read()):
        lines = strings(block)
        if not lines or lines[0] not in NOVELS:
            continue
        novel = NOVELS[lines[0]]
        ps = passages(lines)
        cut = int(len(ps) * 0.85)
        rows["train"] += [(t, novel) for t in ps[:cut]]
        rows["test"] += [(t, novel) for t in ps[cut:]]
    assert len({n for _, n in rows["train"]}) == 6, "not the six novels"
    for split, r in rows.items():
        random.Random(1).shuffle(r)
        with open(f"{out}/{split}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text", "novel"])
            w.writerows(r)
        print(f"{out}/{split}.csv: {len(r)} passages")


if __name__ == "__main__":
    main()
