"""`looped fit`: the command line of `looped.fit`, and a fit printed as a table (`format_result`).

It fits what it is given and says so: files of a folder it left out (and why) go to stderr, a
table with the same run twice, with several studies or with runs of several datasets (two
corpora) is refused unless asked for (a repeated row named with the row it repeats), a fixed value
outside the fitting box is refused (the solver would clamp it), and so is a table whose fit would
need more memory than the machine has (`memory_error`, measured).  A bootstrap over fewer (budget,
r) cells than its intervals need is flagged (`units_needed`).  Every refusal is one line
``looped fit: error: ...`` and exit code 2; every warning one line ``looped fit: warning: ...``.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import warnings
from pathlib import Path

from .fit import (
    BOOT_CHUNK,
    DATA_ROW,
    FIX_KEYS,
    REQUIRED,
    FitResult,
    SkippedRecords,
    at_bounds,
    data_rows,
    fit,
    load_runs,
    mixed_data,
    parse_fix,
)
from .io import add_json_option, destination_error, write_json
from .law import FitError
from .mapping import MAPPINGS
from .resample import cells
from .solver import HI, LAW_PARAMS, LO


def parse_fix_args(items) -> dict:
    """['phi=0.5', 'E=1.7,alpha=0.3'] -> {'phi': '0.5', 'E': '1.7', 'alpha': '0.3'}."""
    out = {}
    for it in items or []:
        for part in it.split(","):
            if "=" not in part:
                raise FitError(f"--fix expects NAME=VALUE, got {part!r}")
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def check_fix(fix: dict) -> None:
    """FitError for a fixed value outside the box the fit searches (the solver would clamp it
    to the edge and the table would still call it fixed)."""
    for name, value in fix.items():
        ((i, theta),) = parse_fix({name: value}).items()
        if not LO[i] <= theta <= HI[i]:
            lo, hi = (math.exp(LO[i]), math.exp(HI[i])) if LAW_PARAMS[i] in ("A", "B", "E") else (LO[i], HI[i])
            raise FitError(f"--fix {name}={fix[name]} lies outside the fitting box: {LAW_PARAMS[i]} in [{lo:.4g}, "
                           f"{hi:.4g}]")


def duplicate_runs(df) -> str | None:
    """Why a runs table holds the same run more than once (one run_id twice in a study, or two
    identical rows), or None."""
    if "run_id" in df.columns and df["run_id"].notna().any():
        key = [c for c in ("study", "run_id") if c in df.columns]
        dup = df[df.duplicated(key, keep=False) & df["run_id"].notna()]
        if len(dup):
            first = dup[dup["run_id"] == dup["run_id"].iloc[0]]
            where = f" (in {', '.join(map(str, first['file']))})" if "file" in df.columns else ""
            return f"run {first['run_id'].iloc[0]} appears {len(first)} times{where}"
    cols = [c for c in (*REQUIRED, "budget", "s", "seed") if c in df.columns]
    again = df.duplicated(cols, keep="first").to_numpy()
    if again.any():   # the first row that repeats an earlier one, and that earlier row
        j = int(again.nonzero()[0][0])
        group = df.groupby(cols, sort=False, dropna=False).ngroup().to_numpy()
        i = int((group == group[j]).nonzero()[0][0])
        rows = data_rows(df)
        more = int(again.sum()) - 1
        return (f"data rows {rows[i]} and {rows[j]} are the same run ({', '.join(cols)} all equal)"
                + (f"; {more} more row(s) repeat an earlier one" if more else ""))
    return None


def few_distinct(n: int, k: int) -> float:
    """P(a resample of n units drawn with replacement holds k or fewer distinct units): the
    occupancy distribution, exactly (surjections by inclusion-exclusion; integers, no rounding)."""
    onto = lambda m: sum((-1) ** i * math.comb(m, i) * (m - i) ** n for i in range(m + 1))  # noqa: E731
    return sum(math.comb(n, m) * onto(m) for m in range(1, min(k, n) + 1)) / n ** n


BOOT_LEVEL = 0.05


def units_needed(k: int, level: float = BOOT_LEVEL) -> int:
    """The fewest resampling units (cells) a block bootstrap of a k-parameter law needs.

    Why: the runs of one (budget, r) cell share their budget and r, so a resample holds as much
    independent information as it holds distinct cells, and a resample with k or fewer distinct
    cells cannot pin down k free parameters: its refit follows noise, or the box's edge, and the
    percentiles with it.  n cells drawn with replacement keep 63% of them on average; we ask that at
    most 5% of resamples fall to k or fewer.  For the joint law (k = 6) that is 13 cells (8 cells:
    93% of resamples, which is how an 8-cell table gave phi the interval [-0.55, 0.50]); for
    k = 5, 12.  The paper's grids and ours have 16 or more."""
    n = k + 1
    while few_distinct(n, k) > level:
        n += 1
    return n


def bootstrap_warning(df, res) -> str | None:
    """One line when the bootstrap had too few units (cells, or runs without a budget column) for
    its intervals to mean anything, or None."""
    if not res.bootstrap:
        return None
    by_cell = "budget" in df.columns
    n = int(cells(df).max()) + 1 if by_cell else len(df)
    k = len(res.free)
    need = units_needed(k)
    if n >= need:
        return None
    what = "(budget, r) cells" if by_cell else "runs"
    return (f"the bootstrap resampled {n} {what}; a {k}-parameter law needs at least {need}: with {n}, "
            f"{few_distinct(n, k):.0%} of resamples hold {k} or fewer distinct ones, too few to pin {k} "
            f"parameters, so the intervals are not meaningful")


# Memory of a fit, measured (issue 51; peak RSS by `/usr/bin/time` of `looped fit` on synthetic tables,
# 2-core Xeon, numpy 2.4): 0.23, 0.34, 0.51 and 0.86 GB at 2,000, 5,000, 10,000 and 20,000 runs (500
# restarts), 0.18, 0.23, 0.30 and 0.43 GB at 50 restarts, 0.34 GB at 2,000 runs with --bootstrap 50; a
# newcomer's 100,000 runs took 3.5 GB and 1,000,000 were killed at 23.4 GB.  The solver evaluates up to
# 128 restarts at a time over every run, some 34 float64 temporaries of (restarts, runs) each: 270 bytes
# per run per restart of a block over 0.16 GB.  The bootstrap solves its resamples in chunks of at most
# looped.fit.BOOT_CHUNK (restart, run) weights (at least one resample's), about two float64 copies of a
# chunk.  A table whose estimate exceeds the memory available is refused before the solver starts.
SOLVER_BLOCK = 128               # looped.solver.OBJ_BLOCK: restarts evaluated together
BYTES_PER_RUN_RESTART = 270
BASE_BYTES = 0.16e9              # the interpreter, numpy, pandas and scipy
CHUNK_COPIES = 2                 # float64 arrays of one bootstrap chunk's weights


def fit_memory(n_runs: int, restarts: int, bootstrap: int = 0, boot_restarts: int = -1) -> float:
    """Estimated peak bytes of `looped fit` on n_runs runs (`boot_restarts` as the command's: -1 is
    `restarts` random starts per resample, k >= 0 is k plus up to 11 warm starts)."""
    need = BASE_BYTES + BYTES_PER_RUN_RESTART * n_runs * min(restarts, SOLVER_BLOCK)
    if bootstrap:
        per = restarts if boot_restarts < 0 else boot_restarts + 11
        chunk = max(min(BOOT_CHUNK, bootstrap * per * n_runs), per * n_runs)
        need += 8.0 * (CHUNK_COPIES * chunk + bootstrap * n_runs)
    return need


def available_memory() -> float | None:
    """Bytes of memory available to a new allocation (Linux: MemAvailable), or None when unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def memory_error(n_runs: int, restarts: int, bootstrap: int = 0, boot_restarts: int = -1) -> str | None:
    """Why a table is too large to fit on this machine (one line), or None."""
    need, have = fit_memory(n_runs, restarts, bootstrap, boot_restarts), available_memory()
    if have is None or need <= have:
        return None
    lo, hi = 0, n_runs                       # the most runs that fit: fit_memory grows with the runs
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fit_memory(mid, restarts, bootstrap, boot_restarts) <= have else (lo, mid - 1)
    per_run = BYTES_PER_RUN_RESTART * min(restarts, SOLVER_BLOCK)
    return (f"{n_runs:,} runs need about {need / 1e9:.1f} GB to fit ({per_run / 1e3:.0f} kB a run at "
            f"{min(restarts, SOLVER_BLOCK)} restarts a block{', more for the bootstrap' if bootstrap else ''}), "
            f"and {have / 1e9:.1f} GB is available: at most {lo:,} runs fit here; fit fewer (one study: --study NAME)")


def format_result(res: FitResult) -> str:
    """A readable table: parameter, value, bootstrap interval (when there is one)."""
    lines = [f"{res.kind} law fit: {res.n_runs} runs, {res.restarts} restarts, seed {res.seed}"
             + (f", {res.bootstrap} bootstrap resamples" if res.bootstrap else "")
             + (f", mapping {res.mapping}" if res.mapping != "power" else "")]
    head = f"  {'param':<6} {'value':>12}"
    if res.ci:
        head += f" {'2.5%':>12} {'97.5%':>12}"
    lines.append(head)
    for name in (*LAW_PARAMS[:5], *res.mapping_of().names):
        v = getattr(res, name) if name in LAW_PARAMS else res.mapping_params[name]
        if v is None:
            lines.append(f"  {name:<6} {'n/a':>12}   (not identifiable: no looped runs)")
            continue
        row = f"  {name:<6} {v:>12.6g}"
        if name in res.fixed:
            row += "   (fixed)"
        elif name in res.ci:
            row += f" {res.ci[name][0]:>12.6g} {res.ci[name][1]:>12.6g}"
        lines.append(row)
    lines.append(f"  R^2 (nats) {res.r2:.5f}   Huber sum {res.huber:.6e}   n_runs {res.n_runs}")
    for r, sub in res.per_r.items():
        lines.append(f"  per-r Chinchilla r={r}: A={sub.A:.4g} alpha={sub.alpha:.4g} B={sub.B:.4g} "
                     f"beta={sub.beta:.4g} E={sub.E:.4g} R^2={sub.r2:.4f} Huber={sub.huber:.3e}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="looped fit", description="Fit the joint scaling law (phi) to a runs table.")
    ap.add_argument("path", help="runs CSV (columns r, n_once, n_rec, tokens, loss; optional budget, s, study, "
                                 "status, run_id) or a folder of run-record JSON files")
    ap.add_argument("--restarts", type=int, default=500, help="random starts in the fitting box (default: 500, "
                                                              "the paper's)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the starts and the bootstrap (default: 0)")
    ap.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE",
                    help="hold a parameter fixed (A, alpha, B, beta, E, phi) at a value inside the fitting box; "
                         "repeatable")
    ap.add_argument("--bootstrap", type=int, default=0, metavar="B",
                    help="block-bootstrap resamples over (budget, r) cells (default: 0, none)")
    ap.add_argument("--boot-restarts", type=int, default=-1,
                    help="-1 (default): --restarts random restarts per resample (the paper's protocol); "
                         "k >= 0: warm starts at the full fit's minima plus k random restarts")
    ap.add_argument("--per-r", action="store_true", help="also fit a Chinchilla law per r")
    ap.add_argument("--mapping", choices=MAPPINGS, default="power",
                    help="how r counts in N_eff = N_once + m(r) N_rec: power (the paper's r^phi, the default), "
                         "linear (m = r), bounded (m = 1 + k1 (1 - exp(-(r - 1) / k2))) or free (one phi per r)")
    add_json_option(ap, "the fit")
    ap.add_argument("--study", help="only the runs of this study (the table's study column)")
    ap.add_argument("--mixed-studies", action="store_true",
                    help="fit the runs of several studies as one law (refused without it)")
    ap.add_argument("--dataset", help="only the runs trained on this dataset (the table's dataset column, e.g. "
                                      "prose-bpe2048-T128)")
    ap.add_argument("--allow-mixed-data", action="store_true",
                    help="fit runs trained on several datasets (the table's dataset column) as one law (refused "
                         "without it)")
    ap.add_argument("--allow-duplicates", action="store_true",
                    help="keep a run that appears more than once (counted once per appearance; refused without it)")
    return ap


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's own convention)
        raise FitError(message)


def _runs(a):
    """The table to fit, after what the options allow: skipped files said on stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SkippedRecords)
        df = load_runs(a.path)     # validate_runs says itself on stderr which non-ok runs it skips
    for w in caught:
        if issubclass(w.category, SkippedRecords):
            print(f"looped fit: warning: {w.message}", file=sys.stderr)
    for column, value in (("study", a.study), ("dataset", a.dataset)):   # --study NAME, --dataset NAME
        if value is not None:
            if column not in df.columns:
                raise FitError(f"--{column} {value}: the runs have no {column} column")
            keep = (df[column].astype(str) == value).to_numpy()
            rows = data_rows(df)
            df = df[keep].reset_index(drop=True)
            df.attrs[DATA_ROW] = tuple(int(n) for n, k in zip(rows, keep) if k)
            if not len(df):
                raise FitError(f"--{column} {value}: no runs of that {column}")
    why = mixed_data(df)   # before the studies: two corpora is the graver mix
    if why and not a.allow_mixed_data:
        raise FitError(f"{why}: pass --dataset NAME to fit one, or --allow-mixed-data to fit them as one law")
    if a.study is None and "study" in df.columns and df["study"].nunique() > 1 and not a.mixed_studies:
        counts = df["study"].astype(str).value_counts().sort_index()
        raise FitError(f"the runs belong to {len(counts)} studies ({', '.join(f'{k} {v}' for k, v in counts.items())}):"
                       " pass --study NAME to fit one, or --mixed-studies to fit them as one law")
    why = duplicate_runs(df)
    if why and not a.allow_duplicates:
        raise FitError(f"{why}: a run counted twice weighs double; remove it, or pass --allow-duplicates")
    return df


def main(argv=None) -> int:
    """`looped fit PATH [--restarts 500] [--seed 0] [--fix phi=0.5 ...] [--bootstrap B] [--per-r]
    [--json [PATH|-]] [--study NAME] [--mixed-studies] [--dataset NAME] [--allow-mixed-data]
    [--allow-duplicates]`."""
    try:
        a = _parser().parse_args(argv)
        for flag, value, low in (("--restarts", a.restarts, 1), ("--seed", a.seed, 0),
                                 ("--bootstrap", a.bootstrap, 0), ("--boot-restarts", a.boot_restarts, -1)):
            if value < low:
                raise FitError(f"{flag} must be >= {low}, got {value}")
        fix = parse_fix_args(a.fix)
        check_fix(fix)
        error = destination_error(a.json, "--json")
        if error:
            raise FitError(error)
        df = _runs(a)
        error = memory_error(len(df), a.restarts, a.bootstrap, a.boot_restarts)
        if error:
            raise FitError(error)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # validate_runs already printed them to stderr
            res = fit(df, restarts=a.restarts, seed=a.seed, fix=fix, bootstrap=a.bootstrap,
                      boot_restarts=None if a.boot_restarts < 0 else a.boot_restarts, per_r=a.per_r,
                      allow_mixed_data=a.allow_mixed_data, mapping=a.mapping)
    except FitError as e:
        print(f"looped fit: error: {str(e).splitlines()[0] if str(e) else 'bad input'}", file=sys.stderr)
        return 2
    print(format_result(res), file=sys.stderr if a.json == "-" else sys.stdout)
    phis = res.phi_equivalents(df["r"])
    if res.mapping != "power" and phis:   # what each r's multiplier is worth as a power of r
        print("  phi-equivalent (r^phi = m(r)): " + ", ".join(
            f"r={r:g} {v['phi']:.4g}" + (f" [{v['lo']:.4g}, {v['hi']:.4g}]" if "lo" in v else "")
            for r, v in phis.items()), file=sys.stderr if a.json == "-" else sys.stdout)
    for name in at_bounds(res):
        print(f"looped fit: warning: {name} ended on the edge of the fitting box: a bound, not an estimate",
              file=sys.stderr)
    if a.bootstrap and "budget" not in df.columns:
        print("looped fit: warning: no budget column: the bootstrap resampled runs, not (budget, r) cells",
              file=sys.stderr)
    warning = bootstrap_warning(df, res)
    if warning:
        print(f"looped fit: warning: {warning}", file=sys.stderr)
    if a.json is not None:
        write_json(a.json, dict(res.to_dict(), phi_equivalent={f"{r:g}": v for r, v in phis.items()}))
    return 0


__all__ = ["FIX_KEYS", "check_fix", "duplicate_runs", "format_result", "main", "parse_fix_args"]
