"""Tables for the book: one `Table` object per table, HTML for the reader, text for nbval.

A chapter builds each table once, as a DataFrame, and shows it as a `Table`: the reader sees the
HTML (readable headers, grouped "ours | paper" columns, numbers formatted by
`looped.report.formatting`, no index column unless it names the rows); nbval compares the text
form, in which the exact columns print as shown and the fitted ones print as checks against the
references recorded with the chapter (`looped.report.checks.checked`), so the text is identical on
every machine where the check passes.  The builders below turn study tables into DataFrames.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from ..solver import LAW_PARAMS
from ..studies.sweep.study import Study
from .checks import checked
from .formatting import eng, number_text, power_of_ten, short_number, span

HTML_MARK = "<!-- looped-table -->"   # the nbval sanitizer hides the HTML between two marks: the text is checked
MAX_WIDTH_CHARS = 100                  # a table wider than this (in characters at the book's font) gets clipped


class Table:
    """A table the reader sees as HTML and nbval checks as text; built once from ``frame``.

    ``tolerances`` (column -> absolute tolerance or '5%') names the fitted columns: they are
    checked against the references recorded under ``check`` ('chapter/cell') when the table is
    built (a number out of tolerance raises, so the cell fails), and the text prints the check
    instead of the number.  A checked number is named '<row> <column>', the row by its ``label``
    column or its index (a single-row table without a label: the column alone).  Where the page
    lays the numbers out otherwise than their references are named (parameters as columns, rows
    of several kinds), ``measured`` gives them by name ({name: value}; ``tolerances`` then maps
    those names) and ``exact`` the part of the table compared exactly (columns of ``frame``, or
    a frame of its own; default: none with ``measured``, else every column without a tolerance).
    ``notes`` are exact facts (counts, flags) added to the text.  ``active=False`` (a papermill
    run with other parameters) judges nothing.  ``styles`` adds CSS rules; the other arguments
    shape the HTML as in `html_table`."""

    def __init__(self, frame: pd.DataFrame, caption: str | None = None, *, headers: dict | None = None,
                 formats: dict | None = None, pairs: bool | tuple = False, index: bool | None = None,
                 check: str | None = None, tolerances: dict | None = None, label: str | None = None,
                 notes: tuple | list = (), active: bool = True, styles: list | None = None,
                 measured: dict | None = None, exact: list | pd.DataFrame | None = None):
        self.frame, self.caption = frame, caption
        named, frame = frame, _index_as_column(frame, index)
        self.styler = html_table(frame, headers=headers, caption=caption, index=index, formats=formats, pairs=pairs)
        if styles:   # extra CSS rules for this table (e.g. column widths), as pandas' set_table_styles takes them
            self.styler = self.styler.set_table_styles(styles, overwrite=False)
        shown, fmt, originals = _readable(frame, headers, formats, pairs)
        self.show_index = not (index is False or (index is None and _plain_index(frame)))
        self.cells = pd.DataFrame({c: [fmt[c](v) for v in shown[c]] for c in shown.columns}, index=shown.index)
        tolerances = tolerances or {}
        lines = [caption] if caption else []
        if measured is None:   # the fitted cells are the ones with a tolerance, the rest is exact
            if exact is None:
                exact = [c for c, orig in zip(shown.columns, originals) if orig not in tolerances]
            measured, tolerances = self._named(named, tolerances, label)
        if isinstance(exact, pd.DataFrame):
            lines.append(exact.apply(lambda col: col.map(lambda v: number_text(v, col.name))).to_string(index=False))
        elif exact:
            lines.append(self.cells[[c for c, orig in zip(shown.columns, originals) if orig in exact or c in exact]]
                         .to_string(index=self.show_index))
        if tolerances:
            if not check:
                raise ValueError("a table with fitted columns needs a check key 'chapter/cell'")
            lines.append(checked(check, measured, tolerances, active=active))
        lines.extend(notes)
        self.text = "\n".join(lines)

    @staticmethod
    def _named(frame, tolerances: dict, label) -> tuple[dict, dict]:
        """The fitted cells as {'<row> <column>': value} and their tolerances under the same names."""
        measured, tol = {}, {}
        for i, (_, row) in enumerate(frame.iterrows()):
            for col, t in tolerances.items():
                single = len(frame) == 1 and label is None
                name = col if single else f"{row[label] if label else frame.index[i]} {col}"
                measured[name], tol[name] = row[col], t
        return measured, tol

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return HTML_MARK + self.styler.to_html() + HTML_MARK.replace("<!-- ", "<!-- /")

    def width_chars(self) -> int:
        """The narrowest the table can be drawn, in characters: cells and headers wrap at spaces
        only, so per column its longest word (a number is one word), plus two for the padding."""
        cols = [(" ".join(map(str, c)) if isinstance(c, tuple) else str(c), self.cells[c]) for c in self.cells.columns]
        if self.show_index:
            cols.append((str(self.cells.index.name or ""), pd.Series(map(str, self.cells.index))))
        return sum(max([len(w) for text in (name, *map(str, values)) for w in text.replace("<br>", " ").split()]
                       + [1]) + 2 for name, values in cols)


def _index_as_column(df, index):
    """A named index becomes the first column: one header row, and the rows' names read like any column."""
    if index is False or _plain_index(df) or not any(n is not None for n in df.index.names):
        return df
    return df.reset_index()


def _plain_index(df) -> bool:
    return isinstance(df.index, pd.RangeIndex) and df.index.start == 0 and df.index.step == 1


def _readable(df, headers=None, formats=None, pairs=False):
    """``df`` with readable column names, the formatter of each (renamed) column, and the
    original column name (the last level of a grouped one) of each."""
    names = {**HEADERS, **(headers or {})}
    if pairs:
        table = group_pairs(df, tuple(pairs)) if isinstance(pairs, (tuple, list)) else group_pairs(df)
    else:
        table = df.copy()
    originals = list(df.columns)
    formats = formats or {}
    fmt = {}
    for col, orig in zip(table.columns, originals):   # a format is found by the original or the shown name
        key = next((k for k in (orig, col, col[-1] if isinstance(col, tuple) else None) if k in formats), None)
        f = formats.get(key) if key is not None else None
        if isinstance(f, str):   # a format string shows a missing cell as number_text does, not 'nan'
            f = (lambda v, f=f: number_text(v) if v is None or v != v else f.format(v))
        fmt[col] = f or (lambda v, c=col: number_text(v, c))

    def readable(c):
        return names.get(c, str(c).replace("_", " ")) if c != "" else ""

    if isinstance(table.columns, pd.MultiIndex):
        new = pd.MultiIndex.from_tuples([tuple(readable(x) for x in c) for c in table.columns])
        fmt = {tuple(readable(x) for x in c): fmt[c] for c in table.columns}
    else:
        new = [readable(c) for c in table.columns]
        fmt = {readable(c): fmt[c] for c in table.columns}
    table.columns = new
    if table.index.name in names:
        table.index.name = names[table.index.name]
    return table, fmt, originals


def law_row(res, ci: bool = True) -> dict:
    """One fitted law as a flat dict: the six parameters, R^2, the Huber sum, the number of runs
    and, with ``ci``, the bootstrap percentiles as ``<param>_lo`` / ``<param>_hi`` (NaN where
    there are none).  A parameter that was held fixed is reported at its fixed value."""
    nan = float("nan")
    out = {}
    for p in LAW_PARAMS:
        v = getattr(res, p)
        out[p] = nan if v is None else float(v)
    out.update(r2=float(res.r2), huber=float(res.huber), n_runs=int(res.n_runs))
    if ci:
        for p in LAW_PARAMS:
            lo, hi = res.ci.get(p, (nan, nan))
            out[f"{p}_lo"], out[f"{p}_hi"] = float(lo), float(hi)
    return out


def cell_format(spec):
    """A column format: ``spec`` for a number; '-' for a missing one, words and yes/no as they are."""
    def cell(v):
        if v is None or isinstance(v, (bool, np.bool_, str)) or v != v:
            return number_text(v)
        return spec(v)
    return cell


def law_formats(frame) -> dict:
    """Cell formats of a table of law parameters, by column (``A``, ``A_lo``, ``A_paper``, ...): A
    and B to three significant digits without an exponent, the other parameters at their precision
    (`number_text`)."""
    def base(c):
        return c[:-len(c.rsplit("_", 1)[-1]) - 1] if c.endswith(("_lo", "_hi", "_paper")) else c
    return {c: cell_format(short_number) if base(c) in ("A", "B")
            else cell_format(lambda v, n=base(c): number_text(v, n)) for c in frame.columns}


INTERVAL_PARAMS = ("alpha", "beta", "phi")   # A, B and E get no interval row: they trade against each other


def law_rows(res, name, paper=None, paper_name="paper", **extra) -> pd.DataFrame:
    """A fitted law for the reader: one row per estimate (the fit, then its bootstrap 2.5 and
    97.5 percentiles of the exponents; with ``paper``, the paper's values and its interval for
    phi), one column per parameter.  ``extra`` adds columns: name -> (value of the fit, value of
    the paper)."""
    row = law_row(res)
    rows = [{"fit": name, **{p: row[p] for p in LAW_PARAMS}, "r2": row["r2"]},
            {"fit": f"{name} 2.5%", **{p: row[f"{p}_lo"] for p in INTERVAL_PARAMS}},
            {"fit": f"{name} 97.5%", **{p: row[f"{p}_hi"] for p in INTERVAL_PARAMS}}]
    for key, (ours, _) in extra.items():
        rows[0][key] = ours
    if paper is not None:
        rows += [{"fit": paper_name, **{p: float(paper[p]) for p in LAW_PARAMS}, "r2": float(paper["r2"]),
                  **{key: theirs for key, (_, theirs) in extra.items()}},
                 {"fit": "paper 2.5%", "phi": float(paper["phi_ci_low"])},
                 {"fit": "paper 97.5%", "phi": float(paper["phi_ci_high"])}]
    return pd.DataFrame(rows, columns=["fit", *LAW_PARAMS, "r2", *extra])


def side_by_side(ours, paper, keys=("ours", "paper")):
    """Two tables with the same row index next to each other under a top column level
    ``ours | paper``; rows present in only one of them are kept (missing cells are NaN)."""
    return pd.concat([ours, paper], axis=1, keys=list(keys))


def iso_flop_display(cells):
    """``iso_flop_cells`` for the reader: runs finished/planned, the best run's width and where it
    sits, the vertex (N*, L*, tokens per param; NaN unless the cell brackets its minimum) and the
    verdict.  Numbers stay numbers; the chapter's `Table` gives the fitted ones their digits."""
    rows = []
    for c in cells.itertuples():
        fitted = bool(c.fitted)
        vertex = fitted and bool(c.opens_up) and bool(c.inside)
        rows.append({
            "budget": c.budget, "r": c.r, "runs": f"{c.finished}/{c.planned}",
            "best s": float("nan") if c.finished == 0 else c.best_s,
            "best run at": c.best_at if isinstance(c.best_at, str) else "-",
            **{k: getattr(c, k) if vertex else float("nan") for k in ("n_star", "loss_star", "tokens_per_param")},
            "bracketed": ("yes" if (c.inside and c.opens_up) else "no") if fitted else "skipped (< 3 runs)",
        })
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------- HTML tables

HEADERS = {  # readable names of the column names used across the package
    "budget": "budget C (FLOPs)", "r": "r", "s": "s", "d_model": "d", "n": "N", "n_once": "N_once",
    "n_rec": "N_rec", "n_eff": "N_eff", "n_star": "N*", "loss_star": "L*", "tokens": "D", "tokens_star": "D*",
    "tokens_per_param": "D/N", "loss": "loss (nats)", "r2": "R²", "phi": "φ", "alpha": "α", "beta": "β",
    "n_runs": "runs", "flops_per_token": "FLOPs/token", "mean_gap": "mean gap", "delta": "Δ loss (nats)",
}








def group_pairs(df, suffixes=("ours", "paper")):
    """Columns named ``<quantity>_<suffix>`` (e.g. ``params_M_ours``, ``params_M_paper``) under a
    two-level header: the quantity on top, ``ours | paper`` below.  A bare column with a suffixed
    sibling (``phi`` beside ``phi_paper``) is ours and says so; other columns keep their name on top
    and an empty second level."""
    names = [str(c) for c in df.columns]
    cols = []
    for c in names:
        top, sub = c, ""
        for suf in suffixes:
            if c.endswith("_" + suf):
                top, sub = c[: -len(suf) - 1], suf
        if not sub and any(f"{c}_{suf}" in names for suf in suffixes):
            sub = "ours"
        cols.append((top, sub))
    out = df.copy()
    out.columns = pd.MultiIndex.from_tuples(cols)
    return out


def html_table(df, headers: dict | None = None, caption: str | None = None, index: bool | None = None,
               formats: dict | None = None, pairs: bool | tuple = False):
    """A DataFrame as a readable HTML table (a pandas Styler: Jupyter and the book render it).

    Column names are replaced by ``headers`` (then `HEADERS`, then underscores become spaces);
    two-level columns (e.g. from `side_by_side`, or ``pairs=True`` for ``x_ours`` / ``x_paper``
    columns, see `group_pairs`; ``pairs=("law", "paper")`` for other suffixes) are shown as
    grouped headers.  Every cell is formatted by
    `number_text` unless ``formats`` gives a format string or function for its column.  The
    index is shown unless it is a plain 0..n-1 range (``index`` overrides)."""
    table, fmt, _ = _readable(df, headers, formats, pairs)
    digest = hashlib.md5((str(caption) + table.to_csv()).encode()).hexdigest()[:8]
    styler = table.style.format(fmt).set_uuid(f"looped{digest}")   # stable ids: reruns change no HTML
    if index is False or (index is None and _plain_index(df)):
        styler = styler.hide(axis="index")
    if caption:
        styler = styler.set_caption(caption)
    words = [j for j, c in enumerate(table.columns) if table[c].map(lambda v: isinstance(v, str)).all()]
    return styler.set_table_styles([   # numbers are right-aligned, words read from the left
        *({"selector": f"td.col{j}", "props": "text-align: left;"} for j in words),
        {"selector": "", "props": "border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0;"},
        {"selector": "th", "props": "text-align: center; padding: 0.25em 0.45em; border-bottom: 1px solid #999;"},
        {"selector": "td", "props": "text-align: right; padding: 0.2em 0.45em; font-variant-numeric: tabular-nums;"},
        {"selector": "caption", "props": "caption-side: top; text-align: left; font-weight: bold;"},
    ])


def plan_summary(table):
    """One row per budget of a study plan: widths s, model sizes, tokens, steps, tokens/param.

    Ranges run over the widths of the budget (and over r where marked); N is unique
    non-embedding parameters, D training tokens per run.
    """
    def rng(values, fmt=eng):   # 'lo–hi' with an en dash, so a cell never breaks after a hyphen
        return span(values, fmt).replace("-", "–")

    rows = []
    for budget, g in table.groupby("budget", sort=True):
        plain = g[g.r == g.r.min()]
        deepest = g[g.r == g.r.max()]
        rows.append({
            "budget": budget,
            "runs": len(g),
            "widths s": rng(g.s, lambda v: f"{v:g}"),
            f"N (r={int(plain.r.iloc[0])})": rng(plain.n),
            f"N (r={int(deepest.r.iloc[0])})": rng(deepest.n),
            "D per run": rng(g.tokens),
            "steps": rng(g.steps, lambda v: f"{int(v)}"),
            f"D/N (r={int(plain.r.iloc[0])})": rng(plain.tokens_per_param, short_number),
        })
    return pd.DataFrame(rows)


def learning_rate_summary(studies=("paper-main", "cpu-main")):
    """Range of each peak learning rate over the runs of each budget of the given studies."""
    rows = []
    for study in studies:
        lr = Study(study).learning_rates()
        for budget, g in lr.groupby("budget", sort=True):
            rows.append({"study": study, "budget": budget,
                         **{k: span(g[k], lambda v: f"{v:.4f}") for k in ("matrix", "embedding", "head", "norm")}})
    return pd.DataFrame(rows)


def scale_comparison(ours: str = "cpu-main", paper: str = "paper-main") -> pd.DataFrame:
    """The two main studies' scale side by side, from their grids and presets: what separates a
    small-scale phi from the paper's (unique non-embedding parameters, training tokens, steps,
    budgets, context, vocabulary, head dimension), with the factor paper / ours (for a range,
    the ratio of the geometric means of its ends)."""
    plans = {name: Study(name).plan() for name in (paper, ours)}
    presets = {name: Study(name).preset for name in (paper, ours)}
    whole = lambda x: f"{int(x):,}"
    rows = []
    for quantity, values, fmt in (
            ("training budget (FLOPs)", lambda s: plans[s].budget, power_of_ten),
            ("unique non-embedding parameters", lambda s: plans[s].n, eng),
            ("training tokens per run", lambda s: plans[s].tokens, eng),
            ("optimizer steps per run", lambda s: plans[s].steps, whole),
            ("width d_model", lambda s: plans[s].d_model, whole),
            ("context length T", lambda s: [presets[s].seq_len], whole),
            ("vocabulary", lambda s: [presets[s].vocab_size], whole),
            ("head dimension", lambda s: [presets[s].head_dim], whole),
            ("effective depth (layers)", lambda s: [presets[s].effective_depth], whole)):
        ends = {s: (float(min(values(s))), float(max(values(s)))) for s in (paper, ours)}
        text = {s: fmt(lo) if lo == hi else f"{fmt(lo)} to {fmt(hi)}" for s, (lo, hi) in ends.items()}
        mid = {s: np.sqrt(lo * hi) for s, (lo, hi) in ends.items()}
        rows.append({"quantity": quantity, "paper": text[paper], "ours": text[ours],
                     "paper / ours": float(mid[paper] / mid[ours])})
    return pd.DataFrame(rows)
