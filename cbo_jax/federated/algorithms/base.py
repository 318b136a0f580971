"""What every federated algorithm is: a pure ``(init, round)`` pair.

``init(key) -> state`` and ``round(state, data) -> (state, info)`` are pure and
jittable. ``data`` is what the algorithm trains on (an
:class:`~cbo_jax.federated.data.AgentData`, or the attack experiments' groups), never
the agents' cluster ids. ``info`` is the algorithm's own NamedTuple of per-round
by-products (fixed shapes, so rounds stack under ``lax.scan``); metrics read it.
``eval_models(state)`` says which models are tested and how: ``("agent", params)`` --
agent ``j`` is tested with its own model ``params[j]`` (FedCBO, Local); ``("server",
params)`` -- the server models, each test set picking the one with the smallest loss
(FedAvg, IFCA; as the paper).

Layout: a state or info NamedTuple lists in ``agent_fields`` the fields whose leading
axis is the agent axis. That is all the runner needs to pad a population with
inactive agents, split it over devices and cut the padding off again
(:mod:`cbo_jax.federated.padding`); the algorithms themselves only respect
``data.agent_mask`` and draw agent ``j``'s randomness on row ``j``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, TypeVar

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax.config import check_types
from cbo_jax.federated.data import AgentData
from cbo_jax.federated.local import LocalSGDConfig
from cbo_jax.population import tree_isfinite_rows, tree_where_rows

PyTree = Any

__all__ = ["AgentData", "Algorithm", "BaselineConfig", "participants", "tree_where_rows", "broadcast", "agent_fields",
           "per_agent_fields", "diverged"]

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class BaselineConfig:
    """What every baseline needs: the share of agents per round and the local SGD.

    Attributes:
      participation: share of agents in G_n each round (1 = all, as the paper).
      local: the local SGD configuration.
    """

    participation: float = 1.0
    local: LocalSGDConfig = LocalSGDConfig()

    def __post_init__(self):
        check_types(self)
        _checks.fraction("participation", self.participation)


class Algorithm(NamedTuple):
    """A federated algorithm: ``init``, ``round``, ``eval_models``, its config and name.

    ``model``: the agents' :class:`~cbo_jax.models.Model` (``None``: not known). The runner
    reads only its ``num_classes``, to refuse labels out of range before the first round.
    ``num_agents``: the agents it was built for, where its state has no agent axis to tell
    (FedAvg, IFCA); the runner refuses data of another number. ``takes``: the class of the
    data its round takes, where it is not an :class:`AgentData` (FedCB²O and DFedAvgM take
    an :class:`~cbo_jax.federated.attacks.AttackData`); the runner refuses other data first,
    and an ``AttackData`` for an algorithm without ``takes``. ``build``: the algorithm again
    from another config of the same class (``build(config) -> Algorithm``), with everything
    else as it was built; a sweep (``run(..., params=grid)``, :mod:`cbo_jax.federated.sweep`)
    builds it inside its trace from a config holding traced numbers (``None``: not sweepable).
    """

    name: str
    init: Callable[[jax.Array], Any]
    round: Callable[[Any, Any], tuple[Any, Any]]
    eval_models: Callable[[Any], tuple[str, PyTree]]
    config: Any
    model: Any = None
    num_agents: int | None = None
    takes: type | None = None
    build: Callable[[Any], Algorithm] | None = None

    def __repr__(self) -> str:  # its name, config and model; not its functions' addresses
        parts = [repr(self.name), f"config={self.config!r}", f"model={self.model!r}"]
        if self.num_agents is not None:
            parts.append(f"num_agents={self.num_agents}")
        if self.takes is not None:
            parts.append(f"takes={self.takes.__name__}")
        return f"Algorithm({', '.join(parts)})"


def per_agent_fields(*fields: str) -> Callable[[type[_T]], type[_T]]:
    """Class decorator for a state or info NamedTuple: ``fields`` have the agent axis first.

    It sets the class attribute ``agent_fields`` (read by :func:`agent_fields`). A decorator
    rather than an assignment in the class body, which type checkers would take for a field.
    """

    def mark(cls: type[_T]) -> type[_T]:
        unknown = [f for f in fields if f not in getattr(cls, "_fields", ())]
        if unknown:
            raise TypeError(f"{cls.__name__} has no fields {unknown}")
        setattr(cls, "agent_fields", fields)
        return cls

    return mark


def agent_fields(tree: Any) -> tuple[str, ...]:
    """The fields of a state or info NamedTuple whose leading axis is the agent axis."""
    return tuple(getattr(type(tree), "agent_fields", ()))


def participants(key: jax.Array, valid: jax.Array, participation: float) -> jax.Array:
    """``(N,)`` mask of ``G_n``: ``max(1, round(participation · N_real))`` real agents at random.

    Agent ``j``'s draw is row ``j`` of one uniform vector, so it does not depend on
    the padding agents after the real ones (``valid`` False), which never take part.
    """
    if participation >= 1:
        return valid
    u = jnp.where(valid, jax.random.uniform(key, valid.shape), jnp.inf)
    size = jnp.maximum(1, jnp.round(participation * jnp.sum(valid)))
    rank = jnp.argsort(jnp.argsort(u))
    return valid & (rank < size)


def diverged(params: PyTree, real: jax.Array | int) -> jax.Array:
    """``(N,)``: the agents whose model holds a NaN or an infinity, among ``real`` (a mask, or
    the number of real agents, which come first). An info's ``diverged`` field, which the
    runner counts (``diverged_agents``) and reports (``on_diverged``)."""
    ok = tree_isfinite_rows(params)
    mask = jnp.arange(ok.shape[0]) < real if isinstance(real, int) else real
    return mask & ~ok


def broadcast(params: PyTree, n: int) -> PyTree:
    """One model repeated for ``n`` agents (a stacked population)."""
    return jax.tree_util.tree_map(lambda leaf: jnp.broadcast_to(leaf, (n,) + leaf.shape), params)
