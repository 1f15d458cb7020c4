"""Summarizes an alternating benchmark log: the lines `taper bench step` and
`benches/torch_step.py` print, under `== bench MODEL PRECISION batch B`
headers (scripts/gpu-check.sh writes them), into one table per header of
medians over the rounds and ratios to taper's default step (its first row).

    python3 benches/ratios.py bench.log [--card-peak-tflops 989]

`--card-peak-tflops` adds, for bf16 and f16 runs, MFU against the card's
peak (an H100's or H200's dense bf16 is 989 TFLOP/s) next to the lines' own
MFU, which is against a matmul measured in the same process.
"""
import argparse
import collections
import re
import statistics
import sys

HEADER = re.compile(r"^== bench (\S+) (\S+) batch (\S+)")
TAPER = re.compile(r"^step \S+ on .+? (?:f32|bf16|f16) ((?:un)?fused\S*): ([\d.]+) ms/step, (\d+) (\w+)/s, peak ([\d.]+ \w+|n/a), ([\d.]+) (\w)FLOP/s")
TORCH = re.compile(r"^torch step \S+ on .+? (?:f32|bf16|f16) \[([^\]]+)\]: ([\d.]+) ms/step, (\d+) (\w+)/s, peak ([\d.]+ \w+|n/a), ([\d.]+) (\w)FLOP/s")
SCALE = {"G": 1e9, "T": 1e12, "P": 1e15, "M": 1e6}
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def mib(peak):
    if peak == "n/a":
        return None
    value, unit = peak.split()
    return float(value) * UNITS[unit] / 2**20


def parse(lines):
    groups = collections.OrderedDict()
    key = ("?", "?", "?")
    for line in lines:
        line = line.strip()
        m = HEADER.match(line)
        if m:
            key = m.groups()
            continue
        for pattern, label in ((TAPER, "taper {}"), (TORCH, "torch [{}]")):
            m = pattern.match(line)
            if m:
                variant, ms, items, unit, peak, rate, prefix = m.groups()
                runs = groups.setdefault(key, collections.OrderedDict())
                runs.setdefault(label.format(variant), []).append(
                    (float(ms), float(items), unit, mib(peak), float(rate) * SCALE[prefix]))
    return groups


def table(key, runs, card_peak):
    model, precision, batch = key
    # taper's first row is its default configuration (`taper bench step`
    # prints it first): the ratios are against that.
    base_name = next((v for v in runs if v.startswith("taper ")), None)
    print(f"\n{model} {precision}, batch {batch} (medians over rounds; ratios are {base_name} / row)")
    base = runs.get(base_name)
    base_items = statistics.median(r[1] for r in base) if base else None
    base_peak = statistics.median(r[3] for r in base if r[3] is not None) if base else None
    for variant, rs in runs.items():
        items = statistics.median(r[1] for r in rs)
        ms = statistics.median(r[0] for r in rs)
        peaks = [r[3] for r in rs if r[3] is not None]
        peak = statistics.median(peaks) if peaks else None
        rate = statistics.median(r[4] for r in rs)
        cols = [f"{variant:52s}", f"{ms:9.2f} ms", f"{items:12.0f} {rs[0][2]}/s"]
        cols.append(f"peak {peak:9.1f} MiB" if peak is not None else "peak       n/a    ")
        if base_items:
            cols.append(f"speed x{base_items / items:5.2f}")
        if base_peak and peak:
            cols.append(f"memory x{base_peak / peak:5.2f}")
        if card_peak and precision in ("bf16", "f16"):
            cols.append(f"MFU {100 * rate / (card_peak * 1e12):5.1f}% of the card")
        cols.append(f"({len(rs)} rounds)")
        print("  " + "  ".join(cols))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--card-peak-tflops", type=float)
    a = ap.parse_args()
    with open(a.log) as f:
        groups = parse(f)
    if not groups:
        sys.exit(f"ratios: no benchmark lines in {a.log}")
    for key, runs in groups.items():
        table(key, runs, a.card_peak_tflops)


if __name__ == "__main__":
    main()
