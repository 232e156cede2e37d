"""Latin hypercube designs whose columns are keyed by parameter name.

A design of `n` points has, in every column, exactly one point in each of the `n` equal strata
of [0, 1] (a random permutation of the strata plus a uniform offset inside each stratum). Here a
column is drawn from a stream keyed by (seed, design number, parameter name), not by the column's
position, so the design is defined before anyone knows the whole search space: every process
computes the same coordinate for the same (design, point, parameter), whatever order the
parameters are suggested in, and a conditional parameter gets its own stratified column too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def name_key(name: str) -> int:
    """A stable 64-bit key for a parameter name (Python's hash() differs between processes)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def lhs_column(seed: int, design: int, name: str, n: int) -> np.ndarray:
    """Column `name` of Latin hypercube design number `design`, `n` points, in [0, 1)."""
    if n < 1:
        raise ValueError(f"A design needs at least one point, got n={n}.")
    rng = np.random.default_rng([seed, design, name_key(name), 0x1A75])
    strata = rng.permutation(n)
    return (strata + rng.random(n)) / n


def lhs_point(seed: int, design: int, point: int, name: str, n: int) -> float:
    """Coordinate `name` of point `point` of design `design`."""
    return float(lhs_column(seed, design, name, n)[point])


# The start: designs of this many points, and at least this many trials before the model leads.
DESIGN_SIZE = 8


def start_size(dimension: int) -> int:
    """How many trials a study of `dimension` parameters starts with: max(d + 1, 8).

    A model of d parameters needs d + 1 points to say anything about every one of them; below
    8 points it cannot tell a trend from the noise of one trial.
    """
    return max(dimension + 1, DESIGN_SIZE)


def design_point(seed: int, number: int, name: str) -> float:
    """Coordinate `name` of trial `number`'s point: point number % 8 of design number // 8.

    Designs of a fixed size, so every process agrees on them before anyone knows how many
    parameters the study has: trials 0 to 7 are one Latin hypercube, 8 to 15 the next.
    """
    return lhs_point(seed, number // DESIGN_SIZE, number % DESIGN_SIZE, name, DESIGN_SIZE)


def latin_hypercube(names: Sequence[str], n: int, *, seed: int = 0, design: int = 0) -> np.ndarray:
    """The design as an (n, len(names)) array, columns in the order of `names`."""
    if len(set(names)) != len(names):
        raise ValueError("Parameter names in a design must be unique.")
    return np.stack([lhs_column(seed, design, name, n) for name in names], axis=1).reshape(
        n, len(names)
    )
