"""Batched test objectives with known minimisers.

Every objective maps an array ``x`` of shape ``(..., d)`` to energies of shape
``(...)``: one call evaluates a whole population ``(N, d)``, or ``M`` runs at once
``(M, N, d)``. Each one can be shifted, ``f_b(x) = f(x - b)``, which moves the
minimiser to ``minimiser(d) + b``; this is how problems with several distinct known
minimisers are built (for example the clustered system's K objectives).

Two Rastrigin forms are provided and named apart, because libraries disagree:

* :class:`Rastrigin` -- CBXpy's un-normalised form ``10 d + Σ_i (x_i² - 10 cos 2π x_i)``
  (used by CBXpy's reference success check, :mod:`cbo_jax.experiments.rastrigin_success`);
* :class:`RastriginNormalized` -- the ``1/d``-normalised form
  ``(1/d) Σ_i (x_i² - 10 cos 2π x_i + 10)`` common in the CBO literature.

The rest of CBXpy's test functions (``cbx.objectives``) are here too, each with its
known minimisers (``minimisers(d)``: all of them, ``minimiser(d)``: the first):
Himmelblau, three-hump camel, McCormick, Easom, Bukin N.6, cross-in-tray, drop wave,
Hölder table, snowflake, eggholder, Michalewicz, the multiplicative multimodal
Rastrigin and Ackley, accelerated sinus, n-d sinus, the 4th-order polynomial, banana,
bimodal, unimodal and Gaussian-mixture ``-log`` densities. The 2-D ones have ``dim = 2``
(another dimension is an error when the objective is traced); ``domain`` is the box a
minimiser is known on (eggholder's lies on its boundary). Two of CBXpy's ``minima``
attributes are wrong and corrected here: Bukin N.6's minimiser is ``(-10, 1)`` (CBXpy
lists ``(0, 0)``, where ``f = 0.1``), and CBXpy's ``drop_wave`` is not the textbook drop
wave but ``-(1 + cos 12r) exp(-r²/(2(1 + r²/1000)))``, minimum ``-2`` at ``0``, which is
what :class:`DropWave` computes.

:func:`from_numpy` makes an objective of a NumPy function (a simulator, legacy code, a
program run in a subprocess), evaluated on the host once per step.
"""

from __future__ import annotations

from typing import Callable

# The objectives by family, one module each; this package is their public path.
from cbo_jax.objectives._base import Objective, cos_2pi
from cbo_jax.objectives._host import HostObjective, from_numpy
from cbo_jax.objectives._classic import (Ackley, Griewank, Quadratic, Rastrigin, RastriginNormalized, Rosenbrock,
                                         Sphere, StyblinskiTang)
from cbo_jax.objectives._nd import (AcceleratedSinus, AckleyMultimodal, GaussianMixture, Michalewicz, NdSinus,
                                    P4thOrder, RastriginMultimodal)
from cbo_jax.objectives._planar import (Banana, Bimodal, Bukin6, CrossInTray, DropWave, Easom, Eggholder, Himmelblau,
                                        HolderTable, McCormick, Snowflake, ThreeHumpCamel, Unimodal)

# Private names of the submodules, importable from the package too (for code that reaches in).
from cbo_jax.objectives._base import _COS_TAYLOR, _norm  # noqa: F401
from cbo_jax.objectives._nd import jax_logsumexp  # noqa: F401
from cbo_jax.objectives._planar import _Planar  # noqa: F401

__all__ = [
    "Objective",
    "from_numpy",
    "HostObjective",
    "Rastrigin",
    "RastriginNormalized",
    "Ackley",
    "Sphere",
    "Quadratic",
    "Rosenbrock",
    "Griewank",
    "StyblinskiTang",
    "Himmelblau",
    "ThreeHumpCamel",
    "McCormick",
    "Easom",
    "Bukin6",
    "CrossInTray",
    "DropWave",
    "HolderTable",
    "Snowflake",
    "Eggholder",
    "Michalewicz",
    "RastriginMultimodal",
    "AckleyMultimodal",
    "AcceleratedSinus",
    "NdSinus",
    "P4thOrder",
    "Banana",
    "Bimodal",
    "Unimodal",
    "GaussianMixture",
    "OBJECTIVES",
    "get_objective",
    "cos_2pi",
]


_ALL: tuple[type[Objective], ...] = (
    Rastrigin, RastriginNormalized, Ackley, Sphere, Quadratic, Rosenbrock, Griewank, StyblinskiTang, Himmelblau,
    ThreeHumpCamel, McCormick, Easom, Bukin6, CrossInTray, DropWave, HolderTable, Snowflake, Eggholder, Michalewicz,
    RastriginMultimodal, AckleyMultimodal, AcceleratedSinus, NdSinus, P4thOrder, Banana, Bimodal, Unimodal,
    GaussianMixture,
)
OBJECTIVES: dict[str, Callable[..., Objective]] = {cls.name: cls for cls in _ALL}


def get_objective(name: str, shift=0.0) -> Objective:
    """Build a registered objective by name (see ``OBJECTIVES``)."""
    try:
        cls = OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown objective {name!r}; choose from {sorted(OBJECTIVES)}") from None
    return cls(shift=shift)
