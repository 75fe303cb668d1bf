"""Source lines of a CUDA kernel ranked by sampled warp stalls, from an Nsight Compute report.

On the GPU machine (the report needs --set full or the SourceCounters section, and -lineinfo, which
the CUDA build passes):

    ncu --kernel-name regex:fwd_intra --launch-count 1 --set full --import-source yes -o /tmp/intra \\
        python3 -m flash_kda_train.bench --impls ours --shapes B1_T8192_H96 --reps 1 --warmup 0
    ncu --import /tmp/intra.ncu-rep --page source --print-source cuda,sass --csv \\
        | python3 benchmarks/ncu_hotspots.py --top 25

Each row: share of all stall samples, line number, source text. Inlined device functions keep
their own file's line numbers (a line of common/mma.cuh shows with that number); the text shown is
that of the line in the first file of the listing.

With --sass, the SASS listing alone (`--print-source sass`) ranked by instruction: share, index in
the kernel's listing, instruction, and the instructions just before it (--before N). A stall is
sampled on the instruction that waits, so a load's latency shows on its first use: the lines before
it name the load (2026-12-07: beta's bf16 load in F4, 10% of its samples, docs/design.md).
"""

import argparse
import collections
import csv
import io
import sys

COLUMN = "Warp Stall Sampling (All Samples)"


def _listing(text: str):
    """The listing's header row and the rows under it; refused without stall samples."""
    rows = list(csv.reader(io.StringIO(text)))
    header_at = next((i for i, row in enumerate(rows) if COLUMN in row), None)
    if header_at is None:
        raise SystemExit(f"no '{COLUMN}' column: was the report taken with --set full (SourceCounters)?")
    return rows[header_at], rows[header_at + 1:]


def hotspots(text: str, top: int):
    header, body = _listing(text)
    column = header.index(COLUMN)
    samples, source, line = collections.Counter(), {}, None
    for row in body:
        if len(row) <= column:
            continue
        if row[0].strip().isdigit():  # a CUDA source line; the SASS rows under it carry its samples
            line = int(row[0])
            source.setdefault(line, row[1].strip())
        try:
            value = float(row[column] or 0)
        except ValueError:
            continue
        if line is not None:
            samples[line] += value
    total = sum(samples.values()) or 1.0
    return [(100.0 * v / total, n, source.get(n, "")) for n, v in samples.most_common(top)]


def sass_hotspots(text: str, top: int, before: int = 0):
    """(share, index, instruction, the `before` instructions before it) of the `top` SASS rows."""
    header, body = _listing(text)
    address, source, column = header.index("Address"), header.index("Source"), header.index(COLUMN)
    listing, samples, seen = [], [], set()
    for row in body:
        if len(row) <= column or not row[address].startswith("0x"):
            continue
        if row[address] in seen:  # a listing printed twice (several launches): count each address once
            break
        seen.add(row[address])
        listing.append(row[source].strip())
        samples.append(float(row[column] or 0))
    total = sum(samples) or 1.0
    ranked = sorted(range(len(listing)), key=lambda i: -samples[i])[:top]
    return [(100.0 * samples[i] / total, i, listing[i], listing[max(0, i - before):i]) for i in ranked]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=25, help="how many lines to print")
    parser.add_argument("--sass", action="store_true", help="rank the SASS instructions of a sass listing")
    parser.add_argument("--before", type=int, default=0, help="with --sass: instructions shown before each")
    args = parser.parse_args()
    if args.sass:
        for share, index, text, context in sass_hotspots(sys.stdin.read(), args.top, args.before):
            for line in context:
                print(f"{'':13}{line[:110]}")
            print(f"{share:5.1f}% {index:>6}  {text[:110]}")
        return
    for share, line, text in hotspots(sys.stdin.read(), args.top):
        print(f"{share:5.1f}% {line:>5}  {text[:110]}")


if __name__ == "__main__":
    main()
