"""No checked cell compares a float to its last digit (issue #54).

nbval compares the text of every cell tagged ``nbval-check-output`` with the committed notebook,
after the sanitizers of tests/nbval_sanitize.cfg.  A glued value is part of that text
(``glue(key, float(v), display=False)`` stores ``application/papermill.record/text/plain``:
``0.744834707365197``), and a fit's last digits depend on the BLAS kernel, the thread count and
the CPU (the same fit gave ``0.744834707365164`` on an AVX-512 Xeon).  The section
``[long-floats]`` of the sanitizer file is the tolerance of such a number: written with 7 or more
significant digits, it is compared on its first 4.  These tests hold every committed checked output
to that rule (nothing with more than 6 significant digits survives the sanitizers) and check that
the rule hides a machine's last digits but never a real change.  `make test-nbval-perturbed` checks
the same on the machine itself: nbval under other BLAS and torch kernels, with no cached fit.
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from nbval.plugin import get_sanitize_patterns

ROOT = Path(__file__).resolve().parents[1]
CFG = ROOT / "tests" / "nbval_sanitize.cfg"
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
MAX_DIGITS = 6                      # formatted numbers (tables, :.3f, pandas) have at most this many
SKIPPED = ("image/png", "image/jpeg", "application/vnd.jupyter.widget-view+json")   # nbval does not compare these
# any decimal number, also one the sanitizer's pattern leaves alone (after a letter, with thousands separators)
NUMBER = re.compile(r"(?<![0-9])\d[\d,]*\.\d+(?:[eE][-+]?\d+)?")

PATTERNS = [(re.compile(rx), rep) for rx, rep in get_sanitize_patterns(CFG.read_text())]   # as nbval reads them
SECTIONS = dict((name, (rx, rep)) for name, rx, rep in      # the same, by section name
                re.findall(r"^\[([\w-]+)\]\n(?:#.*\n)*regex: (.*)\nreplace: (.*)$", CFG.read_text(), re.M))


def sanitize(text: str, patterns=PATTERNS) -> str:
    for rx, rep in patterns:      # nbval: re.sub(regex, replace, s) for each pattern, in file order
        text = rx.sub(rep, text)
    return text


def significant_digits(number: str) -> int:
    mantissa = re.split("[eE]", number)[0].replace(",", "").replace(".", "")
    return len(mantissa.lstrip("0"))


def compared_texts(output: dict):
    """(what, text) for each value nbval compares in one output: the stream's text, each mimetype of its data."""
    if "text" in output:
        yield output.get("name", "stream"), "".join(output["text"])
    for mime, value in (output.get("data") or {}).items():
        if mime not in SKIPPED:
            yield mime, value if isinstance(value, str) else "".join(value)


def checked_cells(path: Path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for i, cell in enumerate(code):
        if "nbval-check-output" in cell.get("metadata", {}).get("tags", []):
            yield i, cell


def long_numbers(path: Path, patterns=PATTERNS) -> list[str]:
    found = []
    for i, cell in checked_cells(path):
        for out in cell.get("outputs", []):
            glued = (out.get("metadata") or {}).get("scrapbook", {}).get("name")
            for what, text in compared_texts(out):
                for number in NUMBER.findall(sanitize(text, patterns)):
                    if significant_digits(number) > MAX_DIGITS:
                        where = f"glue {glued!r}" if glued else what
                        found.append(f"{path.name}, code cell {i} ({where}): {number}")
    return found


# --- the committed notebooks -----------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_checked_output_is_compared_to_its_last_digit(path):
    """After the sanitizers, no number in a checked cell's compared output carries more than 6 significant
    digits: a float's repr (a glued value, a bare print) is cut to 4 by [long-floats]; one the pattern cannot
    see (after a letter, with a thousands separator) fails here: print it formatted, or glue float(v)."""
    found = long_numbers(path)
    assert not found, ("checked output compared to the last digit (see [long-floats] in tests/nbval_sanitize.cfg):\n"
                       + "\n".join(found))


def test_the_rule_sees_the_glued_fits_of_chapter_3():
    """The outputs of issue #54 are there, unsanitized, and the rule would have flagged them."""
    nb = ROOT / "book" / "03_our_phi.ipynb"
    raw = [text for _, cell in checked_cells(nb) for out in cell.get("outputs", [])
           if (out.get("metadata") or {}).get("scrapbook", {}).get("name") == "half_low_phi"
           for _, text in compared_texts(out)]
    assert len(raw) == 1 and significant_digits(raw[0]) > MAX_DIGITS
    assert sanitize(raw[0]) == raw[0][:6]              # 0.7448
    without = [(re.compile(rx), rep) for name, (rx, rep) in SECTIONS.items() if name != "long-floats"]
    assert len(without) == len(PATTERNS) - 1
    assert [f.split(": ")[0] for f in long_numbers(nb, without) if "half_" in f] == [
        f"03_our_phi.ipynb, code cell 13 (glue {k!r})" for k in ("half_low_phi", "half_low_r2", "half_high_phi",
                                                              "half_high_r2")]


# --- the rule itself ---------------------------------------------------------------------------------

# (committed reference, this machine's value): OpenBLAS's SkylakeX (AVX-512, the default here), Haswell and
# Prescott kernels, chapter 3's checked cell of the split fits, fresh fit cache (issue #54)
MACHINE_NOISE = [
    ("0.744834707365197", "0.744834707365164"), ("0.744834707365197", "0.744834707365159"),
    ("0.744834707365197", "0.7448347073659713"), ("0.9425481842001971", "0.9425481841960704"),
    ("0.9425481842001971", "0.942548184287597"), ("0.5805459312253851", "0.5805459318034827"),
    ("0.97627741647783", "0.9762774164890703"), ("0.97627741647783", "0.9762774164842626"),
]


@pytest.mark.parametrize("ref, got", MACHINE_NOISE)
def test_a_machines_last_digits_are_not_compared(ref, got):
    assert ref != got and sanitize(ref) == sanitize(got)


def test_the_stated_tolerance_four_significant_digits():
    assert sanitize("0.744834707365197") == "0.7448"
    assert sanitize("-0.0556604377925396") == "-0.05566"
    assert sanitize("3.814697265625e-06") == "3.814e-06"
    assert sanitize("80.5367499321097") == "80.53"
    assert sanitize("1.2345678901234567e+17") == "1.234e+17"
    assert sanitize("0.0040000000000000036") == "0.004000"
    assert sanitize("123456.789") == "123456"                     # a long integer part is kept whole
    assert sanitize("np.float64(0.744834707365197)") == "np.float64(0.7448)"
    assert sanitize("phi = 0.744834707365197, R^2 = 0.9425481842001971") == "phi = 0.7448, R^2 = 0.9425"


def test_a_real_change_stays_visible():
    assert sanitize("0.7448") != sanitize("0.7458")
    assert sanitize("0.744834707365197") != sanitize("0.745834707365197")
    assert sanitize("0.744834707365197") != sanitize("0.744934707365197")        # 1.3e-4 relative
    rng = random.Random(54)
    for _ in range(20_000):   # any relative change of 1e-3 shows, at any magnitude
        x = rng.uniform(1, 10) * 10.0 ** rng.randint(-6, 4) * rng.choice((1, -1))
        y = x * (1 + rng.choice((1, -1)) * rng.uniform(1e-3, 1e-2))
        assert sanitize(repr(x)) != sanitize(repr(y)), (x, y)


def test_rounding_noise_is_hidden():
    rng = random.Random(54)
    for _ in range(20_000):   # a relative 1e-12 moves the text only across a boundary of the 4th digit: ~1e-8
        x = rng.uniform(1, 10) * 10.0 ** rng.randint(-6, 4)
        y = x * (1 + rng.uniform(-1e-12, 1e-12))
        if significant_digits(repr(x)) > MAX_DIGITS and significant_digits(repr(y)) > MAX_DIGITS:
            assert sanitize(repr(x)) == sanitize(repr(y)), (x, y)


def test_exact_numbers_stay_exact():
    """Counts, accounting and published values are printed as they are and compared as they are."""
    for text in ("24", "40,151,040", "8.307×10⁹", "1.0095", "0.744835", "28.027", "0.19924", "915.82",
                 "1136.5", "2.5e+12", "0.25", "100.0", "within 0.01 of the reference 0.439123", "3.6801 (0.4)"):
        assert sanitize(text) == text
    assert sanitize("0.744835") != sanitize("0.744836")


def test_nbval_reads_every_section():
    assert [(re.compile(rx), rep) for rx, rep in SECTIONS.values()] == PATTERNS
    assert "long-floats" in SECTIONS


def test_nbval_replay_reads_the_same_sanitizers():
    import sys
    sys.path.insert(0, str(ROOT / "tests"))
    import nbval_replay
    assert [(p.pattern, r) for p, r in nbval_replay.sanitizers()] == [(p.pattern, r) for p, r in PATTERNS]
