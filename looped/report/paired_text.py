"""Sentences about the case studies' paired analysis (`looped paired`): each variant run against
its baseline twin, the law held at the main fit, with and without an r-independent offset."""
from __future__ import annotations

from ..studies.paired import DPHI_GRID


def _side(e, paper_delta: float) -> str:
    if e["lo"] <= 0 <= e["hi"]:
        return "which contains zero"
    return "on the paper's side of zero" if (e["estimate"] > 0) == (paper_delta > 0) else "on the other side of zero"


def _open_end(e) -> str:
    """A note when bootstrap resamples reach the edge of the Δφ search range (±3): the interval's end
    there is the range's, not a measurement."""
    share = float(e.get("boot_at_bound", 0.0) or 0.0)
    ends = [name for name, x in (("lower", e.lo), ("upper", e.hi)) if abs(x) >= DPHI_GRID[-1] - 1e-6]
    if share <= 0 or not ends:
        return ""
    return (f" (its {' and '.join(ends)} end{'s are' if len(ends) > 1 else ' is'} the edge of the search range, "
            f"reached by {share:.0%} of resamples, not a measurement)")


def _offset_effect(paired, with_offset) -> str:
    """What freeing an r-independent offset does to a resolved paired estimate: 'flips' (both
    resolved, opposite signs), 'unresolves' (only the paired one resolved) or 'keeps'."""
    resolved = [not (e.lo <= 0 <= e.hi) for e in (paired, with_offset)]
    if all(resolved) and (paired.estimate > 0) != (with_offset.estimate > 0):
        return "flips"
    return "unresolves" if resolved[0] and not resolved[1] else "keeps"


def paired_reading(res: dict, paper_delta: float) -> str:
    """The paired estimates of a case study's change in phi (`looped.studies.paired_study.read_results`),
    read beside the paper's protocol on the same runs, with one rule for every case study."""
    est = res["estimates"].set_index("estimator")
    p, q, o, off = est.loc["paired"], est.loc["paired_offset"], est.loc["paper"], res["offset"]
    text = (f"Pairing each variant run with its baseline twin and holding the law at the main fit gives "
            f"Δφ = {p.estimate:+.3f} [{p.lo:+.3f}, {p.hi:+.3f}], {_side(p, paper_delta)}; the paper's protocol "
            f"on the same runs gives {o.estimate:+.3f} [{o.lo:+.3f}, {o.hi:+.3f}], {_side(o, paper_delta)}.  "
            f"Letting the variant also shift every r's log-loss alike (by {off['estimate']:+.4f} "
            f"[{off['lo']:+.4f}, {off['hi']:+.4f}]) gives Δφ = {q.estimate:+.3f} [{q.lo:+.3f}, {q.hi:+.3f}]"
            + _open_end(q))
    effect = _offset_effect(p, q)
    if effect == "flips":
        text += (": the sign of Δφ turns on whether the variant also helps every r alike, so these runs measure a "
                 "gain, and which part of it is a change in φ is not identified by the law's form alone.")
    elif effect == "unresolves":
        text += ": with that offset free, the change in φ is no longer resolved."
    else:
        text += ", the same reading."
    sim = res["simulation"]
    if len(sim):
        sim = sim.set_index("estimator")
        text += (f"  In {int(sim.loc['paired', 'n_reps'])} simulated replications at the paired estimate, its "
                 f"interval covers the truth {sim.loc['paired', 'coverage']:.0%} of the time with an SD of "
                 f"{sim.loc['paired', 'sd']:.3f}; the paper's protocol {sim.loc['paper', 'coverage']:.0%}, "
                 f"with an SD of {sim.loc['paper', 'sd']:.3f}.")
    return text


def paired_key(res: dict, paper_delta: float, matched: dict | None = None) -> str:
    """The key-results line of a case study's paired analysis: the paired estimate, what freeing an
    r-independent offset does to it, the matched-token estimate when given, and which estimate
    the book reads, judged by the same rule as `paired_reading`."""
    est = res["estimates"].set_index("estimator")
    p, q = est.loc["paired"], est.loc["paired_offset"]
    ci = lambda e: f"{e.estimate:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}]"  # noqa: E731
    text = (f"each variant run against its baseline twin (the law held at the main fit), Δφ = {ci(p)}, "
            f"{_side(p, paper_delta)}")
    effect = _offset_effect(p, q)
    if effect == "flips":
        text += (f"; with an r-independent offset free, {ci(q)}: the runs measure a gain whose split into a change "
                 "of φ and an offset they do not identify")
    elif effect == "unresolves":
        text += f"; with an r-independent offset free, {ci(q)}{_open_end(q)}, no longer resolved"
    if matched is not None:
        m = matched["estimates"].set_index("estimator").loc["paired"]
        text += f".  At matched tokens, {ci(m)}, {_side(m, paper_delta)}"
    sim = res["simulation"]
    if len(sim):
        sim = sim.set_index("estimator")
        text += (f".  The book reads the paired estimates: in simulation they cover the truth "
                 f"{sim.loc['paired', 'coverage']:.0%} of the time with an SD of {sim.loc['paired', 'sd']:.3f}, "
                 f"against {sim.loc['paper', 'sd']:.3f} for the paper's protocol")
    return text[0].upper() + text[1:] + "."


def paired_reproduced(res: dict, paper_delta: float) -> str:
    """`reproduced`'s verdict for the paired estimate, qualified by what freeing an r-independent
    offset does to it: 'not identified' when the offset flips a resolved sign."""
    est = res["estimates"].set_index("estimator")
    p, q = est.loc["paired"], est.loc["paired_offset"]
    if p.lo <= 0 <= p.hi:
        return "not resolved (interval contains 0)"
    effect = _offset_effect(p, q)
    if effect == "flips":
        return "not identified (an r-independent offset flips its sign)"
    verdict = "yes" if (p.estimate > 0) == (paper_delta > 0) else "no (opposite sign)"
    return verdict + (" (not resolved with an offset free)" if effect == "unresolves" else "")
