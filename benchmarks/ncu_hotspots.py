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
"""

import argparse
import collections
import csv
import io
import sys

COLUMN = "Warp Stall Sampling (All Samples)"


def hotspots(text: str, top: int):
    rows = list(csv.reader(io.StringIO(text)))
    header_at = next((i for i, row in enumerate(rows) if COLUMN in row), None)
    if header_at is None:
        raise SystemExit(f"no '{COLUMN}' column: was the report taken with --set full (SourceCounters)?")
    column = rows[header_at].index(COLUMN)
    samples, source, line = collections.Counter(), {}, None
    for row in rows[header_at + 1:]:
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=25, help="how many lines to print")
    args = parser.parse_args()
    for share, line, text in hotspots(sys.stdin.read(), args.top):
        print(f"{share:5.1f}% {line:>5}  {text[:110]}")


if __name__ == "__main__":
    main()
