"""The book's "Cite this" page (book/cite.md) says what CITATION.cff says: the software's title,
authors, version and licence, and the paper's title, authors, year and arXiv identifier; its
paper entry is the bibliography's."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CFF = yaml.safe_load((ROOT / "CITATION.cff").read_text())
PAGE = (ROOT / "book" / "cite.md").read_text()


def entries(text: str) -> dict[str, dict[str, str]]:
    """{key: {field: value}} of the BibTeX entries in ``text`` (one field a line, braces stripped,
    TeX accents made Unicode)."""
    out = {}
    for kind, key, body in re.findall(r"@(\w+)\{([^,\s]+),\n(.*?)\n\}", text, flags=re.S):
        fields = {"type": kind.lower()}
        for name, value in re.findall(r"^\s*(\w+)\s*=\s*(.+?),?\s*$", body, flags=re.M):
            value = value.replace('{\\"u}', "ü").replace('{\\"o}', "ö").replace('{\\"a}', "ä")
            fields[name.lower()] = value.strip().strip("{}")
        out[key] = fields
    return out


def names(persons) -> list[str]:
    return [p.get("name") or f"{p['family-names']}, {p['given-names']}" for p in persons]


def test_software_entry_matches_citation_cff():
    sw = entries(PAGE)["looped2026"]
    assert sw["type"] == "software"
    assert sw["title"] == CFF["title"]
    assert sw["author"] == " and ".join(names(CFF["authors"]))
    assert sw["version"] == str(CFF["version"]) and sw["license"] == CFF["license"]
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert sw["year"] == str(config["copyright"])


def test_paper_entry_matches_citation_cff_and_the_bibliography():
    paper = entries(PAGE)["schwethelm2026recurrence"]
    ref = next(r for r in CFF["references"] if r["type"] == "article")
    assert paper["title"] == ref["title"]
    assert paper["author"] == " and ".join(names(ref["authors"]))
    assert paper["year"] == str(ref["year"]) and paper["url"] == ref["url"]
    arxiv = next(i["value"] for i in ref["identifiers"] if i["value"].startswith("arXiv:"))
    assert paper["eprint"] == arxiv.removeprefix("arXiv:") and paper["archiveprefix"] == "arXiv"
    bib = entries((ROOT / "book" / "references.bib").read_text())["schwethelm2026recurrence"]
    assert {k: bib[k] for k in paper} == paper      # the same entry the chapters cite (less its note)


def test_cite_page_is_listed_under_reference_and_linked_from_the_bibliography():
    toc = (ROOT / "_toc.yml").read_text()
    assert toc.index("caption: Reference") < toc.index("file: book/cite")
    assert "(cite.md)" in (ROOT / "book" / "bibliography.md").read_text()
    assert ":::{admonition} Cite this" in PAGE
