"""benchmarks/sass_loops.py: the loops of a cuobjdump listing (backward branches) and their mix."""

import repo_scripts

sass_loops = repo_scripts.load("benchmarks/sass_loops.py")

LISTING = "\n".join([
    "\t\tFunction : _Z6kernelv",
    "        /*0000*/                   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;   /* 0x000 */",
    "        /*0010*/                   LDS R2, [R3] ;                            /* 0x000 */",
    "        /*0020*/                   IMAD R4, R2, 0x84, R5 ;                   /* 0x000 */",
    "        /*0030*/                   MUFU.EX2 R6, R4 ;                         /* 0x000 */",
    "        /*0040*/                   HMMA.1688.F32.TF32 R8, R12, R14, R8 ;     /* 0x000 */",
    "        /*0050*/              @!P0 BRA 0x20 ;                                /* 0x000 */",
    "        /*0060*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;             /* 0x000 */",
    "        /*0070*/               @P1 BRA 0x10 ;                                /* 0x000 */",
    "        /*0080*/                   BRA 0x90 ;                                /* 0x000 */",
    "        /*0090*/                   EXIT ;                                    /* 0x000 */",
    "\t\tFunction : _Z5otherv",
    "        /*0000*/                   EXIT ;                                    /* 0x000 */",
])


def test_functions_and_their_instructions():
    functions = sass_loops.parse(LISTING)
    assert list(functions) == ["_Z6kernelv", "_Z5otherv"]
    assert [len(x) for x in functions.values()] == [10, 1]
    assert sass_loops.opcode("@!P0 IMAD.WIDE.U32 R2, R3, 0x4, R4") == "IMAD"


def test_backward_branches_are_loops_with_their_mix():
    found = sass_loops.loops(sass_loops.parse(LISTING)["_Z6kernelv"])
    assert [(first, last, count) for first, last, count, _ in found] == [(0x10, 0x70, 7), (0x20, 0x50, 4)]
    outer, inner = found[0][3], found[1][3]
    assert inner == {"mma": 1, "mufu": 1, "lds": 0, "sts": 0, "ldg": 0, "stg": 0, "imad": 1, "bar": 0}
    assert outer["lds"] == 1 and outer["bar"] == 1 and outer["imad"] == 1
