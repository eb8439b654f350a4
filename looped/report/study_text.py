"""Sentences about the study a chapter shows: which study it is, and what its runs show beside
the paper's.  Every sentence is written from the numbers, for whichever study papermill passes
(our CPU study by default, `gpu-main` or the paper's grid on a GPU box)."""
from __future__ import annotations

import math

from ..studies.registry import STUDIES


def study_label(study: str) -> str:
    """How the prose names a study: 'our CPU study' for ours, else its name and what it is."""
    if study.startswith("cpu-") or study.startswith("prose-"):
        return "our CPU study"
    if study.startswith("gpu-"):
        return f"the one-GPU study `{study}`"
    if study.startswith("paper-"):
        return f"the rerun of the paper's grid `{study}`"
    return f"the study `{study}`"


def tokens_per_param_ordering(ours_r1, ours_loop, paper_r1, paper_loop) -> str:
    """Where our bracketed cells' tokens per unique parameter sit against the paper's: the same
    ordering (looped above plain) or not, and higher or lower than the paper's."""
    if not len(ours_r1) or not len(ours_loop):
        return "too few of our cells bracket their minimum to compare the plain and looped optima"
    same = min(ours_loop) > max(ours_r1)
    text = "show the paper's ordering" if same else "do not show the paper's ordering cleanly"
    text += (f": at the optimum the plain model sees {min(ours_r1):.0f} to {max(ours_r1):.0f} tokens per unique "
             f"parameter and the looped ones {min(ours_loop):.0f} to {max(ours_loop):.0f}")
    higher_r1, higher_loop = min(ours_r1) > max(paper_r1), min(ours_loop) > max(paper_loop)
    if higher_r1 and higher_loop:
        more = "the looped ones by more" if max(ours_loop) - max(paper_loop) > max(ours_r1) - max(paper_r1) else \
            "the plain ones by more"
        text += f".  Both sit higher than the paper's, {more}"
    elif max(ours_r1) < min(paper_r1) and max(ours_loop) < min(paper_loop):
        text += ".  Both sit lower than the paper's"
    else:
        text += ".  They overlap the paper's range"
    return text


def r2_gap_sentence(ours_r2, paper_r2, seed_sd: float | None) -> str:
    """Our r = 2 gap to the plain model beside the paper's, and the single-run noise to read it by."""
    if not len(ours_r2):
        return "No budget has enough finished runs to compare r = 2 with the plain model."
    lo, hi = min(ours_r2), max(ours_r2)
    text = f"Our $r = 2$ pays {lo:.3f} to {hi:.3f} nats"
    if lo > max(paper_r2):
        text += (
            ", more than the paper's $r = 2$ at any budget, and so sits closer to $r = 4$ and $r = 8$ than in the paper"
        )
    elif hi < min(paper_r2):
        text += ", less than the paper's $r = 2$ at any budget"
    else:
        text += f", within the paper's range ({min(paper_r2):.3f} to {max(paper_r2):.3f})"
    if seed_sd is not None and math.isfinite(seed_sd):
        text += f".  These are single runs with a seed spread of about {seed_sd:.2f} nats"
    return text + "."


def trained_on_gpu(study: str) -> bool:
    """Studies of the paper's architecture are GPU studies; ours on the `prose` preset run on a CPU."""
    return study in STUDIES and STUDIES[study][2] == "paper"


def cost_paragraph(gpu: bool, achieved_flops: float, peak_flops: float, smallest_paper_run_flops: float) -> str:
    """What the runs' throughput means: against the measured CPU matmul peak, or the GPU's spec."""
    if not (achieved_flops > 0):
        return "No finished run has a recorded wall time yet."
    if gpu:
        return (f"Against the GPU's spec peak of {peak_flops / 1e12:.0f} TFLOP/s (dense bf16) that is "
                f"{achieved_flops / peak_flops:.0%} model-FLOPs utilisation.")
    years = smallest_paper_run_flops / achieved_flops / 3.15e7
    when = (
        "about a year"
        if 0.75 <= years < 1.5
        else (f"{years:.0f} years" if years >= 1.5 else f"{years * 12:.0f} months")
    )
    return (f"A large fp32 matrix product on the same cores, measured while this page ran (a figure that drops "
            f"whenever other jobs share the cores), reaches {peak_flops / 1e9:.0f} GFLOP/s, "
            f"{peak_flops / achieved_flops:.0f} times more.  The right panel shows why: the achieved rate climbs "
            f"with the width, because at these sizes a training step is dominated by per-operation overhead rather "
            f"than arithmetic.  At the rate these runs achieve, one run of the paper's smallest budget would take "
            f"{when}; even at the matmul peak it would take {smallest_paper_run_flops / peak_flops / 86400:.0f} days.")


def edge_best_sentence(narrowest: int, widest: int) -> str:
    """Where the best run of a fitted iso-FLOP cell sits, said without "in 0 cells"."""
    def cells(n):
        return "one fitted cell" if n == 1 else f"{n} fitted cells"
    if narrowest and widest:
        return f"In {cells(narrowest)} the best run is the narrowest one trained, in {widest} the widest."
    if narrowest or widest:
        edge, other = ("narrowest", "widest") if narrowest else ("widest", "narrowest")
        return f"In {cells(narrowest or widest)} the best run is the {edge} one trained, and in none the {other}."
    return "In no fitted cell is the best run the narrowest or the widest one trained."
