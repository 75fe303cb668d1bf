"""The loops of a CUDA kernel's SASS and their instruction mix, from a cuobjdump listing: what a
loop issues per pass, counted here without a GPU (a change that cuts a hot loop's instructions
shows before it is timed).

    cuobjdump -sass -fun <mangled kernel name> build-cuda/libflash_kda_train.so \\
        | python3 benchmarks/sass_loops.py
    cuobjdump -sass build-cuda/libflash_kda_train.so | python3 benchmarks/sass_loops.py --list

The CUDA 13 toolkit of the development machine has no cuobjdump; the PyPI package
`nvidia-cuda-cuobjdump` (13.2.51 reads this toolkit's sm_90a code) puts one under
`site-packages/nvidia/cu13/bin`. `--list` names each function of the listing with its instruction
count (the mangled names that `-fun` takes). A loop is a backward branch: its body runs from the
branch's target to the branch, loops inside it counted in its body too.
"""

import argparse
import collections
import re
import sys

_FUNCTION = re.compile(r"Function\s*:\s*(\S+)")
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\s+(?:\S+\s+)?0x([0-9a-f]+)")
# Instruction classes reported per loop: tensor-core products, special functions, shared and
# global memory, integer multiply-adds (mostly address arithmetic), barriers.
CLASSES = {"mma": ("HMMA", "HGMMA", "IMMA"), "mufu": ("MUFU",), "lds": ("LDS", "LDSM"), "sts": ("STS",),
           "ldg": ("LDG", "LDGSTS"), "stg": ("STG",), "imad": ("IMAD",), "bar": ("BAR",)}


def parse(text):
    """{function: [(address, instruction text)]} in listing order."""
    functions, current = collections.OrderedDict(), None
    for line in text.splitlines():
        match = _FUNCTION.search(line)
        if match:
            current = functions.setdefault(match.group(1), [])
            continue
        match = _INSTRUCTION.search(line)
        if match and current is not None:
            current.append((int(match.group(1), 16), match.group(2)))
    return functions


def opcode(instruction):
    """The opcode without its modifiers and predicate: '@!P0 IMAD.WIDE R2, ...' -> 'IMAD'."""
    words = instruction.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def loops(instructions):
    """[(first address, last address, instruction count, {class: count})], by first address."""
    found = []
    for address, text in instructions:
        match = _BRANCH.search(text)
        if not match or int(match.group(1), 16) >= address:
            continue
        first = int(match.group(1), 16)
        body = [opcode(t) for a, t in instructions if first <= a <= address]
        mix = {name: sum(op in ops for op in body) for name, ops in CLASSES.items()}
        found.append((first, address, len(body), mix))
    return sorted(found)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="the functions of the listing and their sizes")
    parser.add_argument("--min", type=int, default=1, help="loops of at least this many instructions")
    args = parser.parse_args()
    functions = parse(sys.stdin.read())
    if not functions:
        raise SystemExit("no function in the listing: pipe in cuobjdump -sass output")
    for name, instructions in functions.items():
        print(f"{name}: {len(instructions)} instructions")
        if args.list:
            continue
        for first, last, count, mix in loops(instructions):
            if count >= args.min:
                print(f"  loop {first:#07x}-{last:#07x}: {count:5d} " + " ".join(f"{k} {v}" for k, v in mix.items()))


if __name__ == "__main__":
    main()
