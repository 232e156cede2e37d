"""A small exact Gaussian process with a noise term, and log expected improvement: numpy only.

The swarm's surrogate: fitted on every finished trial (up to `MAX_POINTS` of them), it ranks a
particle's candidate moves. Inputs live in the unit cube the swarm moves in; a categorical
parameter is a column of choice indices, compared by whether two choices differ (Hamming), so
its declared order means nothing. The kernel is Matern 5/2 with one length scale per parameter
(ARD), a signal scale and a noise variance, fitted by maximising the marginal likelihood with
the priors Optuna's own GPSampler uses; values are standardised first.

Why our own and not Optuna's `optuna._gp`: that module is private (it may change in any
release) and runs on torch, which a trial process of a model that trains without torch never
imports (about 1.5 s of CPU per process). A fit here is a pure function of the finished trials:
it starts from fixed hyperparameters, never from an earlier fit, so every worker on every node
that reads the same trials fits the same model.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.imports import LazyImport

# scipy's solvers take 0.3 s to import: a short study, or a trial of the start, never needs them.
if TYPE_CHECKING:
    from scipy import linalg, optimize, special
else:
    linalg = LazyImport("scipy.linalg")
    optimize = LazyImport("scipy.optimize")
    special = LazyImport("scipy.special")

# The most finished trials a fit takes (the best half and an even spread of the rest): an exact
# GP costs n^3, and past a few hundred points more of them no longer changes where to go next.
MAX_POINTS = 200
MIN_NOISE = 1e-6
# Where a fit starts its noise variance (of standardised values); with several, one fit from
# each and the most probable kept.
NOISE_STARTS: tuple[float, ...] = (0.01,)
_JITTER = 1e-8


def _matern(sq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Matern 5/2 of squared scaled distances, and its derivative with respect to them."""
    r = np.sqrt(5.0 * sq)
    e = np.exp(-r)
    return e * (1.0 + r + (5.0 / 3.0) * sq), (-5.0 / 6.0) * (1.0 + r) * e


def squared_differences(a: np.ndarray, b: np.ndarray, categorical: np.ndarray) -> np.ndarray:
    """(len(a), len(b), d): squared differences per column; 1 or 0 for a categorical column."""
    diff = a[:, None, :] - b[None, :, :]
    sq = diff * diff
    if categorical.any():
        sq[..., categorical] = (sq[..., categorical] > 0).astype(float)
    return sq


@dataclass(frozen=True)
class Kernel:
    """Inverse squared length scales (one per column), signal variance, noise variance."""

    inverse_sq_lengths: np.ndarray
    scale: float
    noise: float

    def __call__(self, sq: np.ndarray) -> np.ndarray:
        return self.scale * _matern(sq @ self.inverse_sq_lengths)[0]


def _unpack(raw: np.ndarray) -> Kernel:
    return Kernel(np.exp(raw[:-2]), float(np.exp(raw[-2])), float(np.exp(raw[-1])) + MIN_NOISE)


def _loss(
    raw: np.ndarray, sq: np.ndarray, y: np.ndarray, shares: np.ndarray | None = None
) -> tuple[float, np.ndarray]:
    """Minus (log marginal likelihood + log prior), and its gradient in the raw (log) values.
    `shares`: each point's share of the noise (1 / its observations; 1 each when None)."""
    shares = np.ones(len(y)) if shares is None else shares
    k = _unpack(raw)
    theta = k.inverse_sq_lengths
    m, dm = _matern(sq @ theta)
    gram = k.scale * m
    cov = gram + np.diag(k.noise * shares + _JITTER)
    try:
        chol = linalg.cho_factor(cov, lower=True, check_finite=False)
    except linalg.LinAlgError:
        return 1e25, np.zeros_like(raw)
    alpha = linalg.cho_solve(chol, y, check_finite=False)
    inverse = linalg.cho_solve(chol, np.eye(len(y)), check_finite=False)
    log_det = 2.0 * float(np.sum(np.log(np.diag(chol[0]))))
    mll = -0.5 * float(y @ alpha) - 0.5 * log_det
    w = np.outer(alpha, alpha) - inverse  # d(mll)/d(cov) = w / 2
    # The priors of Optuna's GPSampler (optuna/_gp/prior.py), on the same quantities.
    prior = (
        -float(np.sum(0.1 / theta + 0.1 * theta))
        + (math.log(k.scale) - k.scale)
        + (0.1 * math.log(k.noise) - 30.0 * k.noise)
    )
    grad = np.empty_like(raw)
    g = w * (k.scale * dm)
    flat = g.reshape(-1) @ sq.reshape(-1, sq.shape[-1])  # sum over a, b of g * sq[..., j]
    grad[:-2] = 0.5 * theta * flat + (0.1 / theta - 0.1 * theta)
    grad[-2] = 0.5 * float(np.sum(w * gram)) + (1.0 - k.scale)
    raw_noise = math.exp(raw[-1])
    grad[-1] = raw_noise * (0.5 * float(np.diag(w) @ shares) + 0.1 / k.noise - 30.0)
    return -(mll + prior), -grad


def standardise(y: np.ndarray) -> np.ndarray:
    """Values as normal scores of their ranks (a Gaussian copula): the model sees the order of
    the trials, not the scale of a metric whose bad runs are far from its good ones."""
    y = np.asarray(y, dtype=float)
    scores = special.ndtri((_average_ranks(y) - 0.5) / len(y))
    std = float(np.std(scores))
    return (scores - np.mean(scores)) / (std if std > 1e-12 else 1.0)


def _average_ranks(y: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their average (scipy.stats.rankdata's default, whose module
    takes a second to import in every trial process)."""
    order = np.argsort(y, kind="stable")
    ranks = np.empty(len(y))
    ranks[order] = np.arange(1, len(y) + 1)
    _, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def fit_kernel(
    x: np.ndarray,
    y: np.ndarray,
    categorical: np.ndarray,
    counts: np.ndarray | None = None,
    noise_starts: tuple[float, ...] | None = None,
) -> Kernel:
    """The kernel of most posterior probability for standardised values `y` at `x`, from
    fixed starting values (never an earlier fit, so that every process finds the same): one
    fit from each noise variance of `noise_starts`, the most probable kept. `counts`: how many
    observations each value is the mean of (its noise is the kernel's noise over that count);
    one each when None."""
    sq = squared_differences(x, x, categorical)
    d = x.shape[1]
    fits = [
        fit_from(np.concatenate([np.zeros(d), [0.0, math.log(noise)]]), sq, y, counts)
        for noise in noise_starts or NOISE_STARTS
    ]
    return _unpack(min(fits, key=lambda f: float(f.fun)).x)


def fit_from(
    start: np.ndarray, sq: np.ndarray, y: np.ndarray, counts: np.ndarray | None = None
) -> Any:
    """One fit of the raw (log) kernel values from `start`: scipy's result, `.x` the values and
    `.fun` minus their log posterior probability."""
    d = sq.shape[-1]
    return optimize.minimize(
        _loss,
        start,
        args=(sq, y, _shares(counts, len(y))),
        jac=True,
        method="L-BFGS-B",
        bounds=[(-10.0, 10.0)] * d + [(-10.0, 5.0), (-20.0, 2.0)],
        options={"gtol": 1e-2, "maxiter": 60},
    )


def _shares(counts: np.ndarray | None, n: int) -> np.ndarray:
    return np.ones(n) if counts is None else 1.0 / np.maximum(np.asarray(counts, float), 1.0)


_THREADPOOLS: Any = None


def one_blas_thread() -> Any:
    """A context in which numpy's and scipy's BLAS run on one thread. A model's matrices are
    small (a few hundred rows), and OpenBLAS's threads each wait for a second core: on a busy
    2-core machine a recommendation at 1,000 trials took 3.4 s of CPU on two threads against
    0.17 s on one (samplers._pso limits its own the same way)."""
    global _THREADPOOLS
    if _THREADPOOLS is None:
        from threadpoolctl import ThreadpoolController

        _ = linalg.cholesky  # scipy's own OpenBLAS loaded first, or the controller misses it
        _THREADPOOLS = ThreadpoolController()
    return _THREADPOOLS.limit(limits=1, user_api="blas")


_KERNELS: OrderedDict[Any, Kernel] = OrderedDict()
_KERNELS_LOCK = threading.Lock()


def cached_kernel(key: Any, fit: Callable[[], Kernel]) -> Kernel:
    """The kernel `fit` gives for the data `key` names, remembered by this process (a few):
    a fit is a pure function of its data, so any sampler object may reuse another's."""
    with _KERNELS_LOCK:
        if key in _KERNELS:
            _KERNELS.move_to_end(key)
            return _KERNELS[key]
    kernel = fit()
    with _KERNELS_LOCK:
        _KERNELS[key] = kernel
        while len(_KERNELS) > 8:
            _KERNELS.popitem(last=False)
    return kernel


class GaussianProcess:
    """The posterior of a GP over (n, d) inputs `x` with values `y` (to minimise), with a
    given kernel or one fitted to them; `counts`: the observations each value is the mean of."""

    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        categorical: np.ndarray,
        kernel: Kernel | None = None,
        counts: np.ndarray | None = None,
        noise_starts: tuple[float, ...] | None = None,
    ) -> None:
        self.x = np.asarray(x, dtype=float)
        self.categorical = np.asarray(categorical, dtype=bool)
        self.y = standardise(y)
        self.kernel = kernel or fit_kernel(self.x, self.y, self.categorical, counts, noise_starts)
        shares = _shares(counts, len(self.y))
        cov = self._cross(self.x, self.x) + np.diag(self.kernel.noise * shares + _JITTER)
        self._chol = linalg.cholesky(cov, lower=True, check_finite=False)
        self._alpha = linalg.cho_solve((self._chol, True), self.y, check_finite=False)

    def _cross(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """k(a, b), with the scaled distances of numeric columns from one matrix product (the
        fit's per-column differences cost len(a) x len(b) x d)."""
        theta = self.kernel.inverse_sq_lengths
        numeric = ~self.categorical
        sq = np.zeros((len(a), len(b)))
        if numeric.any():
            root = np.sqrt(theta[numeric])
            fa, fb = a[:, numeric] * root, b[:, numeric] * root
            sq += np.sum(fa * fa, axis=1)[:, None] + np.sum(fb * fb, axis=1)[None, :]
            sq -= 2.0 * fa @ fb.T
            np.maximum(sq, 0.0, out=sq)
        if self.categorical.any():
            cat = self.categorical
            sq += (a[:, None, cat] != b[None, :, cat]) @ theta[cat]
        return self.kernel.scale * _matern(sq)[0]

    def _whiten(self, cross: np.ndarray) -> np.ndarray:
        """L^-1 k(X, .) for a (len(X), m) cross-covariance."""
        return linalg.solve_triangular(self._chol, cross, lower=True, check_finite=False)

    def mean(self, x: np.ndarray) -> np.ndarray:
        """The posterior mean at `x`, in standardised units (lower is better)."""
        return self._cross(np.atleast_2d(x), self.x) @ self._alpha

    def posterior(
        self, x: np.ndarray, pending: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance at `x`; `pending` points (running trials) count as observed."""
        return self.given(pending)(x)

    def given(self, pending: np.ndarray | None) -> Callable[[np.ndarray], tuple]:
        """The posterior (mean, variance) as a function, with `pending` points as fantasies.

        Each running trial is a fantasy whose value is the model's own mean there (the kriging
        believer): the mean stays what the finished trials say, and only the variance shrinks
        around the running trials, so workers asking at once do not pile onto one spot. A
        fantasy is taken as exact, without the noise of a real observation: then the variance
        at a running trial is nil and a move keeps away from it (with the noise, 32 trials in
        flight still gathered; docs/sampler.md). The variance given them is a low-rank update
        of the finished trials' (no refactoring).
        """
        if pending is not None and len(pending):
            vr = self._whiten(self._cross(self.x, pending))
            c_rr = self._cross(pending, pending) - vr.T @ vr
            chol_rr = _cholesky_with_jitter(c_rr, self.kernel.scale)

        def posterior(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            x = np.atleast_2d(x)
            cross = self._cross(x, self.x)
            mean = cross @ self._alpha
            vx = self._whiten(cross.T)
            variance = self.kernel.scale - np.sum(vx * vx, axis=0)
            if pending is not None and len(pending):
                # Covariances given the finished trials, of the candidates with the running.
                c_xr = self._cross(x, pending) - vx.T @ vr
                w = linalg.solve_triangular(chol_rr, c_xr.T, lower=True, check_finite=False)
                variance = variance - np.sum(w * w, axis=0)
            return mean, np.maximum(variance, 1e-12)

        return posterior


def _cholesky_with_jitter(matrix: np.ndarray, scale: float) -> np.ndarray:
    """The lower Cholesky factor of a covariance that may be singular (two running trials at
    the same point): the smallest jitter, grown tenfold until it factors."""
    jitter = 1e-6 * scale
    for _ in range(8):
        try:
            return linalg.cholesky(
                matrix + jitter * np.eye(len(matrix)), lower=True, check_finite=False
            )
        except linalg.LinAlgError:
            jitter *= 10
    return np.diag(np.sqrt(np.clip(np.diag(matrix), 0, None) + jitter))


def log_expected_improvement(mean: np.ndarray, variance: np.ndarray, best: float) -> np.ndarray:
    """log E[max(best - f, 0)] for f ~ N(mean, variance), stable far into the tail.

    The form of Ament et al. (2023), "Unexpected improvements to expected improvement": plain
    EI underflows to 0 for every candidate far from the best, and ranking needs its logarithm.
    """
    sigma = np.sqrt(variance)
    z = (best - mean) / sigma
    return np.log(sigma) + _log_h(z)


def _log_h(z: np.ndarray) -> np.ndarray:
    """log(z Phi(z) + phi(z))."""
    z = np.asarray(z, dtype=float)
    out = np.empty_like(z)
    c1 = 0.5 * math.log(2 * math.pi)
    c2 = 0.5 * math.log(math.pi / 2)
    upper = z > -1.0
    zu = z[upper]
    out[upper] = np.log(zu * special.ndtr(zu) + np.exp(-0.5 * zu * zu - c1))
    far = z < -1e8
    mid = ~upper & ~far
    zm = z[mid]
    inner = np.log(special.erfcx(-zm / math.sqrt(2)) * np.abs(zm)) + c2
    out[mid] = -0.5 * zm * zm - c1 + _log1mexp(inner)
    zf = z[far]
    out[far] = -0.5 * zf * zf - c1 - 2.0 * np.log(np.abs(zf))
    return out


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """log(1 - exp(x)) for x < 0, accurate on both sides of -log 2."""
    return np.where(x > -math.log(2), np.log(-np.expm1(x)), np.log1p(-np.exp(x)))
