"""Beta fit of the acceptance tail, with its Kolmogorov-Smirnov statistic (pure numpy).

The paper observes that tokens with acceptance ``a <= 0.999`` follow a scaled Beta
distribution (KS < 0.04). We fit ``a / scale ~ Beta(alpha, beta)`` with ``scale`` = the cut-off
(support ``[0, cutoff]``) by maximum likelihood (Newton on the digamma equations, started at the
method-of-moments estimate), and report ``sup |F_empirical - F_beta|``. Special functions
(digamma, trigamma, the regularised incomplete beta) are implemented here so the runtime
needs no scipy; tests check them against scipy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_TAIL_CUTOFF = 0.999
_EPS = 1e-12  # keeps log(y) and log(1 - y) finite at the support's ends
_NEWTON_STEPS = 100
_CF_MAX_ITER = 1000
_CF_TINY = 1e-300
_ASYMPTOTIC_FROM = 10.0  # digamma/trigamma series are accurate to ~1e-14 past here


@dataclass(frozen=True)
class BetaTailFit:
    alpha: float
    beta: float
    scale: float  # support [0, scale]
    n_tail: int  # tokens with a <= cutoff
    n_total: int
    ks: float  # sup-distance between the tail's empirical CDF and the fitted CDF

    @property
    def tail_fraction(self) -> float:
        return self.n_tail / self.n_total if self.n_total else float("nan")


def digamma(x: float) -> float:
    """psi(x) for x > 0 (recurrence to x >= 10, then the asymptotic series)."""
    if not x > 0:
        raise ValueError(f"x = {x!r}: digamma needs x > 0")
    acc = 0.0
    while x < _ASYMPTOTIC_FROM:
        acc -= 1.0 / x
        x += 1.0
    inv2 = 1.0 / (x * x)
    series = inv2 * (1 / 12 - inv2 * (1 / 120 - inv2 * (1 / 252 - inv2 * (1 / 240 - inv2 / 132))))
    return acc + math.log(x) - 0.5 / x - series


def trigamma(x: float) -> float:
    """psi'(x) for x > 0 (recurrence to x >= 10, then the asymptotic series)."""
    if not x > 0:
        raise ValueError(f"x = {x!r}: trigamma needs x > 0")
    acc = 0.0
    while x < _ASYMPTOTIC_FROM:
        acc += 1.0 / (x * x)
        x += 1.0
    inv = 1.0 / x
    inv2 = inv * inv
    series = inv + inv2 / 2 + inv * inv2 * (1 / 6 - inv2 * (1 / 30 - inv2 * (1 / 42 - inv2 * (1 / 30 - inv2 * 5 / 66))))
    return acc + series


def beta_cdf(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """Regularised incomplete beta I_x(alpha, beta), vectorised over x: [...] -> [...] float64.

    Continued fraction (modified Lentz), using I_x(a, b) = 1 - I_{1-x}(b, a) where it converges faster.
    """
    x = np.clip(np.asarray(x, dtype=np.float64), 0.0, 1.0)
    out = np.where(x >= 1.0, 1.0, 0.0)
    inner = (x > 0) & (x < 1)
    xi = x[inner]
    flip = xi > (alpha + 1.0) / (alpha + beta + 2.0)
    xs = np.where(flip, 1.0 - xi, xi)
    a = np.where(flip, beta, alpha)
    b = np.where(flip, alpha, beta)
    log_front = (
        math.lgamma(alpha + beta) - math.lgamma(alpha) - math.lgamma(beta) + a * np.log(xs) + b * np.log1p(-xs)
    )
    value = np.exp(log_front) * _beta_continued_fraction(xs, a, b) / a
    out[inner] = np.where(flip, 1.0 - value, value)
    return out


def _beta_continued_fraction(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = np.ones_like(x)
    d = _nonzero(1.0 - qab * x / qap)
    d = 1.0 / d
    h = d.copy()
    for m in range(1, _CF_MAX_ITER + 1):
        m2 = 2 * m
        num = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 / _nonzero(1.0 + num * d)
        c = _nonzero(1.0 + num / c)
        h *= d * c
        num = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 / _nonzero(1.0 + num * d)
        c = _nonzero(1.0 + num / c)
        delta = d * c
        h *= delta
        if np.all(np.abs(delta - 1.0) < 1e-15):
            break
    return h


def _nonzero(v: np.ndarray) -> np.ndarray:
    return np.where(np.abs(v) < _CF_TINY, _CF_TINY, v)


def fit_beta_mle(y: np.ndarray) -> tuple[float, float]:
    """MLE (alpha, beta) of Beta data y in (0, 1): [N] -> (alpha, beta). Needs N >= 2 and spread."""
    y = np.clip(np.asarray(y, dtype=np.float64), _EPS, 1.0 - _EPS)
    alpha, beta = fit_beta_moments(y)
    s1, s2 = float(np.mean(np.log(y))), float(np.mean(np.log1p(-y)))
    for _ in range(_NEWTON_STEPS):
        dab, tab = digamma(alpha + beta), trigamma(alpha + beta)
        g = np.array([digamma(alpha) - dab - s1, digamma(beta) - dab - s2])
        jac = np.array([[trigamma(alpha) - tab, -tab], [-tab, trigamma(beta) - tab]])
        step = np.linalg.solve(jac, g)
        # Halve the step until both parameters stay positive.
        t = 1.0
        while alpha - t * step[0] <= 0 or beta - t * step[1] <= 0:
            t /= 2
        alpha, beta = alpha - t * step[0], beta - t * step[1]
        if np.all(np.abs(t * step) <= 1e-12 * np.array([alpha, beta])):
            break
    return float(alpha), float(beta)


def fit_beta_moments(y: np.ndarray) -> tuple[float, float]:
    """Method-of-moments (alpha, beta) of data in (0, 1): [N] -> (alpha, beta)."""
    y = np.asarray(y, dtype=np.float64)
    if y.size < 2:
        raise ValueError(f"y: {y.size} values; a Beta fit needs at least 2")
    mean, var = float(y.mean()), float(y.var())
    if var <= 0 or not 0 < mean < 1:
        raise ValueError(f"y: mean {mean!r}, variance {var!r}; a Beta fit needs 0 < mean < 1 and variance > 0")
    common = mean * (1 - mean) / var - 1
    if common <= 0:  # more spread than any Beta: fall back to a U-shaped start
        common = 0.5
    return mean * common, (1 - mean) * common


def ks_statistic(samples: np.ndarray, cdf) -> float:
    """One-sample KS statistic sup |F_n - F|. samples: [N]; cdf maps [N] -> [N]."""
    x = np.sort(np.asarray(samples, dtype=np.float64))
    n = x.size
    if n == 0:
        return float("nan")
    f = cdf(x)
    i = np.arange(1, n + 1)
    return float(max(np.max(i / n - f), np.max(f - (i - 1) / n)))


def fit_beta_tail(acceptance: np.ndarray, cutoff: float = DEFAULT_TAIL_CUTOFF) -> BetaTailFit:
    """Fit ``a / cutoff ~ Beta`` on the tokens with ``a <= cutoff``. acceptance: [N] in [0, 1]."""
    if not 0 < cutoff <= 1:
        raise ValueError(f"cutoff = {cutoff!r}: must be in (0, 1]")
    acceptance = np.asarray(acceptance, dtype=np.float64).ravel()
    tail = acceptance[acceptance <= cutoff] / cutoff
    alpha, beta = fit_beta_mle(tail)
    ks = ks_statistic(tail, lambda v: beta_cdf(v, alpha, beta))
    return BetaTailFit(alpha, beta, cutoff, int(tail.size), int(acceptance.size), ks)


__all__ = [
    "BetaTailFit", "fit_beta_tail", "fit_beta_mle", "fit_beta_moments", "beta_cdf", "ks_statistic",
    "digamma", "trigamma", "DEFAULT_TAIL_CUTOFF",
]
