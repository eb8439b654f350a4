"""How a chapter names the study it shows: our CPU study by default, or the study papermill passes
(`gpu-main` or the paper's grid on a GPU box).  The chapters write their own sentences in Markdown;
this is the one label that changes with the study."""
from __future__ import annotations


def study_label(study: str) -> str:
    """How the prose names a study: 'our CPU study' for ours, else its name and what it is."""
    if study.startswith("cpu-") or study.startswith("prose-"):
        return "our CPU study"
    if study.startswith("gpu-"):
        return f"the one-GPU study `{study}`"
    if study.startswith("paper-"):
        return f"the rerun of the paper's grid `{study}`"
    return f"the study `{study}`"
