"""benchmarks/ncu_hotspots.py: stall samples of the SASS rows summed onto their CUDA source line."""

import pytest

import repo_scripts

ncu_hotspots = repo_scripts.load("benchmarks/ncu_hotspots.py")

LISTING = "\n".join([
    '"Kernel Name","fkt::cuda::fwd_intra_kernel(fkt::cuda::ForwardParams)"',
    '"Line No","Source","Address","Source","Warp Stall Sampling (All Samples)","# Samples"',
    '"10","  a = b;","","","",""',
    '"","","0x10","LDS R1, [R2]","30","30"',
    '"","","0x20","FFMA R3, R1, R1, R3","10","10"',
    '"12","  c = expf(d);","","","",""',
    '"","","0x30","MUFU.EX2 R4, R5","45","45"',
    '"13","  e = f;","","","",""',
    '"","","0x40","MOV R6, R7","15","15"',
])


def test_samples_are_summed_per_source_line_and_ranked():
    rows = ncu_hotspots.hotspots(LISTING, top=2)
    assert [(round(share, 1), line, text) for share, line, text in rows] == [
        (45.0, 12, "c = expf(d);"), (40.0, 10, "a = b;")]


def test_a_report_without_stall_samples_is_refused():
    with pytest.raises(SystemExit, match="--set full"):
        ncu_hotspots.hotspots('"Line No","Source"\n"1","x"', top=5)


SASS_LISTING = "\n".join([
    '"Kernel Name","fkt::cuda::fwd_state_wgmma_kernel(fkt::cuda::FwdStateWgmmaParams)",',
    '"Address","Source","Warp Stall Sampling (All Samples)","# Samples"',
    '"0x10","      LDG.E.U16 R10, desc[UR50][R10.64]","5","5"',
    '"0x20","      IMAD.U32 R238, R10, 0x10000, RZ","60","60"',
    '"0x30","      BAR.SYNC.DEFER_BLOCKING 0x0","35","35"',
    '"0x10","      LDG.E.U16 R10, desc[UR50][R10.64]","5","5"',  # the listing printed again
])


def test_sass_rows_are_ranked_with_the_instructions_before_them():
    rows = ncu_hotspots.sass_hotspots(SASS_LISTING, top=2, before=1)
    assert [(round(share, 1), index, text, context) for share, index, text, context in rows] == [
        (60.0, 1, "IMAD.U32 R238, R10, 0x10000, RZ", ["LDG.E.U16 R10, desc[UR50][R10.64]"]),
        (35.0, 2, "BAR.SYNC.DEFER_BLOCKING 0x0", ["IMAD.U32 R238, R10, 0x10000, RZ"])]
