"""Fit the joint scaling law of looped models with the paper's protocol.

    L(N_once, N_rec, D, r) = E + A (N_once + r^phi N_rec)^(-alpha) + B D^(-beta)

`fit` minimises the paper's objective (`looped.solver.objective_reference`) from random starts in
the paper's box, and adds block-bootstrap intervals over (budget, r) cells; `load_runs` reads a
runs table (a CSV or a folder of run records); the `looped fit` command is `looped.fit_cli`.  A table
of runs trained on several datasets (its ``dataset`` column) is refused unless asked.  A fit is a
deterministic function of its runs, its arguments and this code, so with ``$LOOPED_FIT_CACHE`` set
a repeated identical fit is read back instead of solved again.  Torch-free: imports in milliseconds.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import scipy

from . import records
from .io import atomic_write_bytes
from .law import FitError, Law
from .mapping import Mapping
from .resample import cell_resample, cells
from .solver import LAW_PARAMS, LOG_SLOTS, THETA_PARAMS, RunArrays, law_loss, natural, random_starts, solve_restarts

REQUIRED = records.RUN_COLUMNS   # r, n_once, n_rec, tokens, loss


FIX_KEYS = {"A": 0, "a": 0, "alpha": 1, "B": 2, "b": 2, "beta": 3, "E": 4, "e": 4, "phi": 5}


BOOT_CHUNK = 6_000_000   # bootstrap: resamples solved together, at most this many (restart x run) weights


class SkippedRecords(UserWarning):
    """Files of a folder that `load_runs` left out, and why (`looped fit` prints them on stderr)."""


def records_to_fit(path: Path) -> "pd.DataFrame":
    """The runs of a folder of records (`looped.records.runs_table`) the fitter reads: an unreadable
    or torn file is skipped with a warning (SkippedRecords) each, and records with none of the
    columns `REQUIRED` with one warning naming them."""
    table = records.runs_table(path)
    other = list(table.attrs.get("ignored", []))
    if len(table):
        corrupt = table["status"].eq("corrupt") & table[[c for c in REQUIRED if c in table]].isna().all(axis=1)
        for name in table.loc[corrupt, "file"]:
            warnings.warn(f"skipping {name}: not a JSON run record (unreadable, torn or not JSON)", SkippedRecords,
                          stacklevel=3)
        norun = ~corrupt & table[[c for c in REQUIRED if c in table]].isna().all(axis=1)
        other += list(table.loc[norun, "file"])
        if (corrupt | norun).any():
            table = pd.DataFrame(table[~(corrupt | norun)].dropna(axis=1, how="all").to_dict("records"))
    if other:
        shown = ", ".join(other[:5]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
        warnings.warn(f"ignoring {len(other)} JSON file(s) with none of the columns {', '.join(REQUIRED)}: {shown}",
                      SkippedRecords, stacklevel=3)
    return table


def load_runs(path) -> "pd.DataFrame":
    """Runs table from a CSV file or a directory of run-record JSON files (one per run).

    Required columns r, n_once, n_rec, tokens, loss; optional budget, s, study, status,
    injection, bptt_k, dataset (a CSV column `budget_flops` is read as budget).  A folder's records
    give each run's dataset and corpus_version (`looped.records.record_data`).  JSON records may nest
    fields under "config"/"result"; top-level keys win.  Rows whose status is not 'ok' are
    dropped with a warning.  Raises FitError (one line) for unreadable input, missing columns
    or non-positive / non-finite values.
    """
    p = Path(path)
    if not p.exists():
        raise FitError(f"{p}: no such file or directory")
    if p.is_dir():
        df = records_to_fit(p)
        if not len(df):
            raise FitError(f"{p}: no run-record JSON files found")
    else:
        try:
            if p.suffix == ".json":
                rec = json.loads(p.read_text())
                df = pd.DataFrame(rec if isinstance(rec, list) else [rec])
            else:
                df = pd.read_csv(p)
        except Exception as e:  # noqa: BLE001 - any parse failure is a one-line input error
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise FitError(f"{p}: unreadable ({msg})") from None
        sep = next((s for s in (";", "\t") if len(df.columns) == 1 and s in str(df.columns[0])), None)
        if sep:   # a spreadsheet's export in another locale: say so, not "missing columns"
            raise FitError(f"{p}: one column read, its header holds {sep!r}: looped fit reads comma-separated "
                           f"files; save the table as CSV with commas")
    if "budget" not in df.columns and "budget_flops" in df.columns:
        df = df.rename(columns={"budget_flops": "budget"})
    return validate_runs(df, str(p))


DATA_ROW = "data_row"   # df.attrs key: each run's data row in the file it was read from (1-based)


def data_rows(df) -> "range | tuple":
    """Each run's data row in the table as read (1-based), kept through the runs `validate_runs` skips;
    a table reordered or regrown since (its index no longer 0, 1, ...) counts its rows afresh."""
    rows = df.attrs.get(DATA_ROW)
    fresh = rows is None or len(rows) != len(df) or not df.index.equals(pd.RangeIndex(len(df)))
    return range(1, len(df) + 1) if fresh else rows


def _row(df, i: int, where: str, rows=None) -> str:
    """Where the i-th run of a table came from, for an error: its record file, else its data row (1-based)."""
    if "file" in df.columns and isinstance(df["file"].iloc[i], str):
        return f"{where}: {df['file'].iloc[i]}"
    return f"{where}: data row {(rows or data_rows(df))[i]}"


def validate_runs(df, where: str = "runs", need: tuple = ()):
    """The fitter's runs table, checked and cast (see `REQUIRED`); ``need``: columns an analysis also
    needs.  FitError (one line) otherwise."""
    if len(df) == 0 and len(df.columns) == 0:
        raise FitError(f"{where}: no runs (the table is empty)")
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise FitError(f"{where}: missing column(s) {', '.join(missing)}")
    rows = data_rows(df)
    df = df.copy()
    if "status" in df.columns:
        st = df["status"].fillna("ok").astype(str)
        bad = st != "ok"
        if bad.any():
            msg = f"{where}: skipping {int(bad.sum())} run(s) whose status is not 'ok'"
            warnings.warn(msg, stacklevel=3)
            print(f"looped fit: warning: {msg}", file=sys.stderr)
            df = df[~bad].copy()
            rows = tuple(int(n) for n, b in zip(rows, bad) if not b)
    for c in REQUIRED + tuple(c for c in ("budget", "s") if c in df.columns):
        vals = pd.to_numeric(df[c], errors="coerce")
        if c in ("budget", "s") and vals.isna().all():
            df = df.drop(columns=c)
            continue
        nonfinite = ~np.isfinite(vals.to_numpy(dtype=float))
        if nonfinite.any():
            i = int(np.flatnonzero(nonfinite)[0])
            raise FitError(f"{_row(df, i, where, rows)}: {c} is missing or not a finite number ({df[c].iloc[i]})")
        v = vals.to_numpy(dtype=float)
        low = (v < 0) if c == "n_rec" else ((v < 1) | (v % 1 != 0)) if c == "r" else (v <= 0)
        if low.any():   # r counts the recurrences: 1, 2, 3, ...
            i = int(np.flatnonzero(low)[0])
            what = "negative" if c == "n_rec" else "not a positive integer" if c == "r" else "not positive"
            raise FitError(f"{_row(df, i, where, rows)}: {c} is {what} ({v[i]:g})")
        df[c] = v
    if len(df) == 0:
        raise FitError(f"{where}: no runs to fit")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise FitError(f"{where}: missing column(s) {', '.join(missing)}")
    df = records.cast(df).reset_index(drop=True)
    df.attrs[DATA_ROW] = rows
    return df


def mixed_data(df) -> str | None:
    """Why a runs table pools runs of several datasets (each named with its number of runs), or None:
    a table without a ``dataset`` column is one unnamed dataset, and runs without a name are not
    counted."""
    if "dataset" not in df.columns:
        return None
    counts = df["dataset"].dropna().astype(str).value_counts().sort_index()
    if len(counts) < 2:
        return None
    return (f"the runs were trained on {len(counts)} datasets "
            f"({', '.join(f'{name}: {n} runs' for name, n in counts.items())})")


@dataclass
class FitResult:
    """A fitted law and how it was fitted.  `params` is the fitted `Law` (A, B, E in natural units;
    phi None for a Chinchilla fit: no run with r > 1 and n_rec > 0, or a per-r fit); its six
    parameters read as attributes (``res.phi``).  huber is the summed objective at the optimum; ci
    maps each free parameter to its bootstrap (2.5%, 97.5%) percentiles.  mapping: how r counts
    (`looped.mapping`), its parameters in mapping_params (the bounded and free mappings have phi
    None and no `law`; `predict` and `phi_equivalent` work for every mapping)."""
    params: Law
    r2: float
    huber: float
    n_runs: int
    restarts: int
    ci: dict = field(default_factory=dict)
    kind: str = "joint"          # "joint", or "chinchilla" (phi None)
    fixed: dict = field(default_factory=dict)
    seed: int = 0
    bootstrap: int = 0
    theta: tuple = ()
    per_r: dict = field(default_factory=dict)
    seconds: float = 0.0
    boot_samples: np.ndarray | None = field(default=None, repr=False)
    mapping: str = "power"
    mapping_params: dict = field(default_factory=dict)
    boot_theta: np.ndarray | None = field(default=None, repr=False)   # the resamples' solver coordinates

    A = property(lambda self: self.params.A)
    alpha = property(lambda self: self.params.alpha)
    B = property(lambda self: self.params.B)
    beta = property(lambda self: self.params.beta)
    E = property(lambda self: self.params.E)
    phi = property(lambda self: self.params.phi)

    @property
    def law(self) -> Law:
        """The fitted law (for `looped.law`'s predictions and frontiers)."""
        if self.mapping in ("bounded", "free"):
            raise FitError(f"a fit with the {self.mapping} mapping is no r^phi law: use its predict(df)")
        return self.params

    def mapping_of(self) -> Mapping:
        return Mapping.from_params(self.mapping, self.mapping_params)

    def predict(self, df, theta=None) -> np.ndarray:
        """Loss (nats) of every run of df under the fit (or at solver coordinates `theta`, e.g. a
        resample's `boot_theta` row); FitError for an r the free mapping has no phi for."""
        mp = self.mapping_of()
        if mp.name == "free" and np.isnan(mp.log_multiplier(df["r"].to_numpy(float), mp.levels)).any():
            raise FitError(f"the free mapping has a phi for r in {list(mp.levels)} only")
        data = mp.design(RunArrays.from_frame(df, chinchilla=self.kind == "chinchilla"))
        return law_loss(np.asarray(self.theta if theta is None else theta, float), data)

    def phi_equivalent(self, r) -> np.ndarray:
        """The phi with r^phi = the fitted multiplier m(r) (r > 1)."""
        return self.mapping_of().phi_equivalent(r, np.asarray(self.theta[5:], float))

    def phi_equivalents(self, r_values) -> dict:
        """{r: {'phi': phi_equivalent(r)} and, with a bootstrap, its 95% percentiles 'lo', 'hi'} for every
        r > 1 of r_values (none for a Chinchilla fit; the free mapping's from the resamples that drew r)."""
        mp, out = self.mapping_of(), {}
        for r in sorted({float(v) for v in np.asarray(r_values, float).ravel() if v > 1}) * (self.kind != "chinchilla"):
            out[r] = {"phi": float(self.phi_equivalent(r))}
            if self.boot_theta is not None:
                boot = (self.boot_samples[:, 5 + mp.levels.index(r)] if mp.name == "free"
                        else np.array([mp.phi_equivalent(r, th[5:]) for th in self.boot_theta]))
                boot = boot[np.isfinite(boot)]
                out[r].update(zip(("lo", "hi"), map(float, np.percentile(boot, [2.5, 97.5]) if len(boot) else ())))
        return out

    @property
    def free(self) -> list[str]:
        out = [p for p in (*LAW_PARAMS[:5], *self.mapping_of().names) if p not in self.fixed]
        return [p for p in out if not (p == "phi" and self.phi is None and self.mapping == "power")]

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in (*LAW_PARAMS, "r2", "huber", "n_runs", "restarts", "kind", "seed",
                                             "bootstrap", "seconds", "mapping")}
        d["mapping_params"] = {k: float(v) for k, v in self.mapping_params.items()}
        d["fixed"] = dict(self.fixed)
        d["ci"] = {k: [float(v[0]), float(v[1])] for k, v in self.ci.items()}
        d["theta"] = dict(zip((*THETA_PARAMS[:5], *self.mapping_of().coordinates), map(float, self.theta)))
        if self.per_r:
            d["per_r"] = {str(k): v.to_dict() for k, v in self.per_r.items()}
        return {k: (float(v) if isinstance(v, np.floating) else v) for k, v in d.items()}


def parse_fix(fix: dict | None):
    """{'phi': 0.5, 'E': 1.7, ...} -> {index in theta: value in log-space coordinates}."""
    out = {}
    for k, v in (fix or {}).items():
        if k not in FIX_KEYS:
            raise FitError(f"cannot fix {k!r}: choose from A, alpha, B, beta, E, phi")
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise FitError(f"fixed value for {k} must be a number, got {v!r}") from None
        if not math.isfinite(v):
            raise FitError(f"fixed value for {k} must be finite")
        if k in ("A", "B", "E"):
            if v <= 0:
                raise FitError(f"fixed {k} must be positive, got {v:g}")
            v = math.log(v)
        out[FIX_KEYS[k]] = v
    return out


def _r2(theta, data: RunArrays) -> float:
    pred = law_loss(theta, data)
    ss_res = float(((data.loss - pred) ** 2).sum())
    ss_tot = float(((data.loss - data.loss.mean()) ** 2).sum())
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")


def bootstrap_weights(df, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """(n_boot, n) multiplicities: block bootstrap over (budget, r) cells, else over runs
    (`looped.resample`; cells in sorted order, so the row order does not change the intervals)."""
    return cell_resample(cells(df) if "budget" in df.columns else np.arange(len(df)), rng, n_boot)


def is_chinchilla(df) -> bool:
    """True when phi is not identifiable: no run with r > 1, or every n_rec is 0."""
    return not bool(((df["r"].to_numpy(float) > 1) & (df["n_rec"].to_numpy(float) > 0)).any())


CACHE_ENV = "LOOPED_FIT_CACHE"


def _cache_file(df, arguments: dict) -> Path | None:
    """Where the fit of these runs with these arguments is kept ($LOOPED_FIT_CACHE unset: None).
    The key covers the runs table, the arguments, the source of the fitter and its solver and
    the numpy and scipy versions (their optimisers and kernels shape the result)."""
    folder = os.environ.get(CACHE_ENV)
    if not folder:
        return None
    key = hashlib.sha256(f"numpy {np.__version__} scipy {scipy.__version__}".encode())
    for source in (Path(__file__), Path(__file__).with_name("solver.py")):
        key.update(source.read_bytes())
    key.update(json.dumps([list(map(str, df.columns)), arguments], sort_keys=True, default=str).encode())
    key.update(pd.util.hash_pandas_object(df, index=True).to_numpy().tobytes())
    return Path(folder) / f"{key.hexdigest()[:40]}.pkl"


def fit(df, restarts: int = 500, seed: int = 0, fix: dict | None = None, bootstrap: int = 0,
        boot_restarts: int | None = None, per_r: bool = False, polish: int = 3,
        chinchilla: bool | None = None, allow_mixed_data: bool = False, mapping: str = "power") -> FitResult:
    """Fit the joint law to a runs table with the paper's protocol (the solver: `looped.solver`).

    restarts: random starts (uniform in the box, numpy Generator seeded by `seed`);
    fix: parameters held fixed (A, alpha, B, beta, E, phi; natural units), removed from the
    optimisation; bootstrap: number of block-bootstrap resamples (2.5/97.5 percentiles of every
    free parameter in `ci`); boot_restarts: None (default) is the paper's literal protocol,
    `restarts` random starts per resample and the best kept; an int k instead uses warm starts
    at the full-data optimum and the full fit's other distinct local minima plus k random
    starts (faster, an approximation); per_r: also fit a Chinchilla law per r (`per_r` dict);
    chinchilla: force (True) or forbid (False) the Chinchilla law; default: automatic.
    mapping: how r counts in N_eff (`looped.mapping`): 'power' (the paper's r^phi), 'linear' (phi = 1),
    'bounded' (1 + k1 (1 - exp(-(r - 1) / k2))) or 'free' (one phi per r); same objective, box and bootstrap.
    A table whose ``dataset`` column names several datasets (runs of two corpora) is refused with a
    FitError (`mixed_data`) unless `allow_mixed_data`.
    With $LOOPED_FIT_CACHE set, a fit already made with the same runs and arguments is reused.
    """
    df = validate_runs(df)
    why = None if allow_mixed_data else mixed_data(df)
    if why:
        raise FitError(f"{why}: fit one dataset's runs, or pass allow_mixed_data=True to fit them as one law")
    arguments = dict(restarts=restarts, seed=seed, fix=fix, bootstrap=bootstrap, boot_restarts=boot_restarts,
                     per_r=per_r, polish=polish, chinchilla=chinchilla, mapping=mapping)
    cached = _cache_file(df, arguments)
    if cached is not None:
        try:
            return pickle.loads(cached.read_bytes())
        except Exception:  # absent, torn or from another version: fit again and overwrite it
            pass
    res = _fit(df, **arguments)
    if cached is not None:
        atomic_write_bytes(cached, pickle.dumps(res))
    return res


def _fit(df, restarts, seed, fix, bootstrap, boot_restarts, per_r, polish, chinchilla, mapping) -> FitResult:
    t0 = time.perf_counter()
    if chinchilla is None:
        chinchilla = is_chinchilla(df)
    mp = Mapping.of("power" if chinchilla else mapping, df["r"])
    fixed = parse_fix(fix)
    if chinchilla:
        fixed = {i: v for i, v in fixed.items() if i != 5}
        fixed[5] = 0.0
    if mp.name != "power" and 5 in fixed:
        raise FitError(f"phi cannot be fixed in the {mp.name} mapping (the linear mapping is phi = 1)")
    fixed.update(mp.fixed)
    lo, hi = mp.box()
    free = np.ones(len(lo), bool)
    free[list(fixed)] = False
    k = int(free.sum())
    if len(df) < k + 1:
        raise FitError(f"too few runs to fit: {len(df)} run(s) for {k} free parameters (need at least {k + 1})")
    if restarts < 1:
        raise FitError("restarts must be at least 1")
    data = mp.design(RunArrays.from_frame(df, chinchilla=chinchilla))
    ss = np.random.SeedSequence(seed)
    rng_starts, rng_boot, rng_bstarts = (np.random.default_rng(s) for s in ss.spawn(3))
    starts = random_starts(rng_starts, restarts, fixed, lo, hi)
    ((theta, fbest, minima),) = solve_restarts(data, starts, free, polish=polish, lo=lo, hi=hi)
    names = (*LAW_PARAMS[:5], *mp.names)
    res = FitResult(Law.from_theta(theta, chinchilla or mp.name in ("bounded", "free")), r2=_r2(theta, data),
                    huber=fbest, n_runs=len(df), restarts=restarts, kind="chinchilla" if chinchilla else "joint",
                    fixed={names[i]: (math.exp(v) if i in LOG_SLOTS else v)
                           for i, v in fixed.items() if not (chinchilla and i == 5)},
                    seed=seed, bootstrap=bootstrap, theta=tuple(map(float, theta)), mapping=mp.name,
                    mapping_params=dict(zip(mp.names, map(float, mp.natural(theta[5:])))))
    if bootstrap > 0:
        W = bootstrap_weights(df, rng_boot, bootstrap)
        if boot_restarts is None:   # the literal protocol: `restarts` random starts per resample
            blocks = [random_starts(rng_bstarts, restarts, fixed, lo, hi) for _ in range(bootstrap)]
        else:                       # warm starts + boot_restarts random starts
            warm = np.vstack([theta[None, :], minima[:10]])
            blocks = [np.vstack([warm, random_starts(rng_bstarts, boot_restarts, fixed, lo, hi)])
                      for _ in range(bootstrap)]
        per = len(blocks[0])
        chunk = max(1, int(BOOT_CHUNK // (per * len(df))))
        thetas = []
        for c0 in range(0, bootstrap, chunk):
            c1 = min(bootstrap, c0 + chunk)
            st = np.vstack(blocks[c0:c1])
            grp = np.repeat(np.arange(c1 - c0), per)
            sols = solve_restarts(data, st, free, weights=W[c0:c1][grp], group=grp, n_groups=c1 - c0, polish=1,
                                  lo=lo, hi=hi)
            thetas += [s[0] for s in sols]
        T = np.array(thetas)
        nat = natural(T)
        nat[:, 5:] = mp.natural(nat[:, 5:])
        if mp.name == "free":   # a phi_R whose runs a resample did not draw is not estimated there: NaN
            nat[:, 5:][W @ data.Z == 0] = np.nan
        res.boot_samples, res.boot_theta = nat, T
        for i, name in enumerate(names):
            if free[i]:
                col = nat[:, i]
                lo, hi = np.percentile(col[np.isfinite(col)], [2.5, 97.5])
                res.ci[name] = (float(lo), float(hi))
    if per_r:
        for r in sorted(df["r"].unique()):   # (the table's datasets were checked above)
            sub = df[df["r"] == r].reset_index(drop=True)
            res.per_r[float(r) if r % 1 else int(r)] = fit(sub, restarts=restarts, seed=seed, fix=fix,
                                                          polish=polish, chinchilla=True, allow_mixed_data=True)
    res.seconds = time.perf_counter() - t0
    return res


def at_bounds(res, tol: float = 1e-6) -> list:
    """Names of the free parameters of a fit that ended on the edge of the search box (the
    optimum lies outside the box; such a value is a bound, not an estimate)."""
    th, mp = np.asarray(res.theta, float), res.mapping_of()
    lo, hi = mp.box()
    if th.size != len(lo):
        return []
    return [p for i, p in enumerate((*LAW_PARAMS[:5], *mp.names))
            if p in res.free and (abs(th[i] - lo[i]) < tol or abs(th[i] - hi[i]) < tol)]
