"""How much a recurrence is worth: the mapping from r to m(r), the multiplier of N_rec in the law's
effective size N_eff = N_once + m(r) N_rec::

    power    m = r^phi                                    the paper's law (one parameter)
    linear   m = r                                        phi = 1: every pass worth a unique block
    bounded  m = 1 + k1 (1 - exp(-(r - 1) / k2))          saturating (Chen, Goyal and Krishnamoorthi,
                                                          arXiv 2609.40316); m tends to 1 + k1
    free     m = r^phi_r, one phi_r per r > 1 of the runs  the saturated model: in sample, no mapping
                                                          fits better; it cannot price an r it never saw

Each mapping is a design of the one law (`looped.solver.RunArrays`: Z . c, or the bounded `link`),
fitted by `looped.fit.fit(..., mapping=NAME)` with the paper's objective, box, restarts and cell
bootstrap.  Its phi-equivalent at r is the phi with r^phi = m(r): constant for power, 1 for linear.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .law import FitError
from .solver import HI, LO, RunArrays

MAPPINGS = ("power", "linear", "bounded", "free")
BOUNDED_BOX = ((-7.0, -3.0), (5.0, 7.0))   # lo and hi of (log a, log k2), a = k1 / k2: see `Bounded`


class Bounded:
    """The bounded mapping's log multiplier log(1 + k1 (1 - exp(-(r - 1) / k2))), the solver's `link`
    (`RunArrays.link`): its value and first and second derivatives at c = (log a, log k2) (P, 2).

    a = k1 / k2 is what the first extra pass is worth (dm/dr at r = 1) and k2 the scale of the
    saturation, in passes.  In these coordinates no saturation (k2 past the largest r) is one flat
    direction, m = 1 + a (r - 1), not a curved ridge of (k1, k2) along which a solver creeps."""
    k = 2

    def __init__(self, r):
        self.r1 = np.asarray(r, float) - 1.0

    def __call__(self, c):
        a, k2 = np.exp(c[:, :1]), np.exp(c[:, 1:2])
        t = self.r1 / k2                                 # (P, n)
        e = np.exp(-t)
        g = -np.expm1(-t)                                # 1 - e^-t
        h = g - t * e                                    # 1 - e^-t (1 + t)
        u, u2 = a * k2 * g, a * k2 * h                   # m - 1 and its derivative in log k2
        v = 1.0 + u
        j = [u / v, u2 / v]
        d2 = [[u / v - j[0] * j[0], u2 / v - j[0] * j[1]], [None, a * k2 * (h - t * t * e) / v - j[1] * j[1]]]
        d2[1][0] = d2[0][1]
        return np.log1p(u), j, d2


@dataclass(frozen=True)
class Mapping:
    """One mapping (`MAPPINGS`); `levels`: the r > 1 that the free mapping gives a phi of their own."""
    name: str = "power"
    levels: tuple = ()

    @classmethod
    def of(cls, name: str, r=()) -> "Mapping":
        """The mapping called `name` for runs at loop counts `r` (the free mapping's levels)."""
        if name not in MAPPINGS:
            raise FitError(f"unknown mapping {name!r}: choose from {', '.join(MAPPINGS)}")
        levels = tuple(sorted({float(v) for v in np.asarray(r, float).ravel() if v > 1})) if name == "free" else ()
        if name == "free" and not levels:
            raise FitError("the free mapping needs runs with r > 1")
        return cls(name, levels)

    @classmethod
    def from_params(cls, name: str, params) -> "Mapping":
        """The mapping of a fit from its parameter names (the free mapping's phi_R)."""
        return cls(name, tuple(float(p[4:]) for p in params) if name == "free" else ())

    @property
    def names(self) -> tuple:
        """Its parameters, natural units: phi; k1, k2; phi_R per level."""
        if self.name == "bounded":
            return ("k1", "k2")
        return tuple(f"phi_{v:g}" for v in self.levels) if self.name == "free" else ("phi",)

    @property
    def coordinates(self) -> tuple:
        """The solver's coordinates c of its parameters (bounded: log a = log(k1 / k2) and log k2)."""
        return ("log_a", "log_k2") if self.name == "bounded" else self.names

    @property
    def fixed(self) -> dict:
        """{index in theta: value} it holds: linear is power with phi = 1."""
        return {5: 1.0} if self.name == "linear" else {}

    @property
    def n_free(self) -> int:
        """Its free parameters (the law's five not counted)."""
        return len(self.names) - len(self.fixed)

    def box(self) -> tuple[np.ndarray, np.ndarray]:
        """The solver's box: the paper's for A, alpha, B, beta, E; phi's for every phi; BOUNDED_BOX."""
        k = len(self.names)
        lo, hi = BOUNDED_BOX if self.name == "bounded" else ([LO[5]] * k, [HI[5]] * k)
        return np.r_[LO[:5], lo], np.r_[HI[:5], hi]

    def design(self, data: RunArrays) -> RunArrays:
        """`data` with this mapping's multiplier (power and linear: the paper's design Z = log r)."""
        if self.name == "bounded":
            return dataclasses.replace(data, link=Bounded(np.exp(data.logr)))
        if self.name == "free":
            return data.design(self._onehot(np.exp(data.logr)))
        return data

    def _onehot(self, r) -> np.ndarray:
        return np.isclose(np.asarray(r, float)[:, None], np.asarray(self.levels)[None, :], rtol=1e-9).astype(float)

    def natural(self, c) -> np.ndarray:
        """Coordinates c (..., k) in natural units (bounded: k1 = a k2 and k2)."""
        c = np.asarray(c, float)
        if self.name != "bounded":
            return c
        return np.stack([np.exp(c[..., 0] + c[..., 1]), np.exp(c[..., 1])], axis=-1)

    def to_coordinates(self, values) -> np.ndarray:
        """The inverse of `natural`."""
        values = np.asarray(values, float)
        if self.name != "bounded":
            return values
        return np.stack([np.log(values[..., 0] / values[..., 1]), np.log(values[..., 1])], axis=-1)

    def log_multiplier(self, r, c) -> np.ndarray:
        """log m(r) at coordinates c (k,); NaN at an r > 1 the free mapping has no phi for."""
        r, c = np.asarray(r, float), np.asarray(c, float)
        if self.name == "bounded":
            return Bounded(r.ravel())(c[None, :])[0][0].reshape(r.shape)
        if self.name == "free":
            hot = self._onehot(r.ravel())
            seen = (hot.sum(1) > 0) | (r.ravel() == 1)
            return np.where(seen, np.log(r.ravel()) * (hot @ c), np.nan).reshape(r.shape)
        return c[0] * np.log(r)

    def phi_equivalent(self, r, c) -> np.ndarray:
        """The phi with r^phi = m(r), for r > 1."""
        r = np.asarray(r, float)
        return self.log_multiplier(r, c) / np.log(r)
