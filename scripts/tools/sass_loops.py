"""Summarizes what ptxas made of a kernel file (scripts/kernel-sass.sh runs
this): per kernel, its registers and spills (from `ptxas -v`), its
instruction count, and its main loop's (the longest loop with tensor-core
products, else the longest loop): the instructions of one pass, those after
its last cp.async commit (the work on a tile, without queuing the next
tile's copies), and where the pass splits into two paths (an `if` around two copies of the work, as
kernels/flash.cu's unmasked and masked tiles), each path's. Static counts
from `nvdisasm -c`: a path without inner loops runs each instruction once
a pass, so for straight-line tile bodies they are the work per tile.

    python3 scripts/tools/sass_loops.py PTXAS_LOG SASS [KERNEL_REGEX]
"""
import re
import sys

# A branch and its label (`BRA P1, label` branches on a second predicate too).
BRA = r"BRA\s+(?:!?U?P\d,\s*)?`?\(?(\.L_x_\d+)"
KINDS = ["HMMA", "MUFU", "LDSM", "LDGSTS", "LDS", "STS", "BAR", "SHFL"]


def kernels(sass):
    """{name: [instruction text]} and each kernel's labels {label: index}."""
    out, name = {}, None
    for line in sass.split("\n"):
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*):$", line)
        if m and not m.group(1).startswith(".L"):
            name = m.group(1)
            out[name] = ([], {})
            continue
        if ".section" in line:
            name = None
        if name is None:
            continue
        ins, labels = out[name]
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = re.search(r"/\*[0-9a-f]{4}\*/\s+(.*?);", line)
        if m:
            ins.append(m.group(1))
    return out


def main_loop(ins, labels):
    """(first, last) of the longest loop with HMMA, else the longest loop."""
    loops = []
    for i, s in enumerate(ins):
        m = re.search(BRA, s)
        if m and labels.get(m.group(1), i) < i:
            loops.append((labels[m.group(1)], i))
    if not loops:
        return None
    with_mma = [lp for lp in loops if any("HMMA" in ins[j] for j in range(lp[0], lp[1] + 1))]
    return max(with_mma or loops, key=lambda lp: lp[1] - lp[0])


def counts(ins, lo, hi):
    return " ".join(f"{k} {sum(k in ins[j] for j in range(lo, hi))}" for k in KINDS
                    if any(k in ins[j] for j in range(lo, hi)))


def main():
    log, sass = open(sys.argv[1]).read(), open(sys.argv[2]).read()
    pattern = re.compile(sys.argv[3] if len(sys.argv) > 3 else ".")
    regs = {}
    for block in log.split("Compiling entry function '")[1:]:
        name = block.split("'")[0]
        used = re.search(r"Used (\d+) registers", block)
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", block)
        regs[name] = (int(used.group(1)) if used else 0, spill.groups() if spill else ("?", "?"))
    for name, (ins, labels) in sorted(kernels(sass).items()):
        if not pattern.search(name):
            continue
        r, (st, ld) = regs.get(name, (0, ("?", "?")))
        print(f"{name}: {r} registers, spills {st}/{ld} bytes (stores/loads), {len(ins)} instructions")
        loop = main_loop(ins, labels)
        if loop is None:
            continue
        lo, hi = loop
        print(f"  main loop: {hi - lo + 1} instructions a pass ({counts(ins, lo, hi + 1)})")
        # After the pass's last cp.async commit (LDGDEPBAR): the work on
        # the tile, without the copies queued for the next one.
        dep = [k for k in range(lo, hi + 1) if "LDGDEPBAR" in ins[k]]
        if dep:
            print(f"  after the copies are queued: {hi - dep[-1]} instructions "
                  f"({counts(ins, dep[-1] + 1, hi + 1)})")
        # The pass's two paths: a forward conditional branch whose target
        # lies inside the loop, just after an unconditional branch that
        # skips to the paths' join.
        for i in range(lo, hi):
            m = re.match(r"@!?P\d\s+" + BRA, ins[i])
            if not m or not lo < labels.get(m.group(1), 0) <= hi:
                continue
            second = labels[m.group(1)]
            j = re.match(BRA, ins[second - 1])
            if not j or not second < labels.get(j.group(1), 0) <= hi + 1:
                continue
            join = labels[j.group(1)]
            a, b = (i + 1, second - 1), (second, join)
            if any("HMMA" in ins[k] for k in range(*a)) and any("HMMA" in ins[k] for k in range(*b)):
                print(f"  paths: {a[1] - a[0]} instructions ({counts(ins, *a)}) "
                      f"or {b[1] - b[0]} ({counts(ins, *b)}); "
                      f"before them {i + 1 - lo} a pass, after {hi + 1 - join}")
                break


if __name__ == "__main__":
    main()
