"""Several processes (hosts), one program: JAX's own distributed runtime.

Every process runs the same script. :func:`initialize` connects them through
``jax.distributed.initialize`` (a coordinator at ``HOST:PORT``, ``num_processes``
processes, this one's ``process_id``); afterwards ``jax.devices()`` lists the devices
of all processes, :func:`cbo_jax.sharding.agent_mesh` spans them, and
``simulate(..., mesh=agent_mesh())`` splits the agent axis across hosts. The
cross-host step, the consensus reduction, is an all-reduce XLA inserts; on CPU it
runs over Gloo (TCP), on GPUs over NCCL. No transport is written here.

Command line: every ``cbo-jax`` command accepts, before the command name,
``--coordinator HOST:PORT --num-processes P --process-id I`` (or the environment
variables ``CBO_JAX_COORDINATOR``, ``CBO_JAX_NUM_PROCESSES``, ``CBO_JAX_PROCESS_ID``)::

    # on each of 2 machines (or twice on one, for a loopback test):
    cbo-jax --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 0 optimize --shard ...
    cbo-jax --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 1 optimize --shard ...

Only process 0 prints results and writes files (:func:`is_main`).
"""

from __future__ import annotations

import os
import sys
import threading

import jax
import numpy as np

__all__ = ["initialize", "is_main", "to_host", "from_env"]


def initialize(coordinator_address: str, num_processes: int, process_id: int, timeout: int = 120) -> None:
    """Connect this process to the others (call before any other JAX work).

    On CPU the cross-process collectives use Gloo; the address must be reachable
    by every process (``127.0.0.1:PORT`` for several processes on one machine). Waits at
    most ``timeout`` seconds for all ``num_processes`` processes (saying so on standard
    error), then raises ``ValueError`` naming the coordinator.
    """
    counts = (num_processes, process_id)
    if (not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in counts)
            or num_processes < 1 or not 0 <= process_id < num_processes):
        raise ValueError(f"need num_processes >= 1 and 0 <= process_id < num_processes, got "
                         f"{num_processes!r} and {process_id!r}")
    # ":1234" would wait out the whole timeout and "host:12o4" fail in gRPC ("Failed to start RPC server")
    host, _, port = coordinator_address.rpartition(":") if isinstance(coordinator_address, str) else ("", "", "")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"coordinator address must be HOST:PORT (a port in 1..65535), got {coordinator_address!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms in ("", "cpu"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    print(f"process {process_id}: waiting up to {timeout} s for all {num_processes} processes at the coordinator "
          f"{coordinator_address}", file=sys.stderr, flush=True)
    # JAX's own start-up timeout aborts the whole process (no Python exception to catch), so a
    # watchdog says what went wrong and exits first; JAX's deadline is set later than it.
    joined = threading.Event()

    def watchdog():
        if not joined.wait(timeout):
            print(f"cbo-jax: error: process {process_id} could not join the {num_processes} processes at the "
                  f"coordinator {coordinator_address} within {timeout} s: is every process started, with the same "
                  f"--coordinator and --num-processes, and is the address reachable?", file=sys.stderr, flush=True)
            os._exit(2)

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                                   process_id=process_id, initialization_timeout=timeout + 60)
    finally:
        joined.set()


def _env_int(name: str, default: str) -> int:
    text = os.environ.get(name, default)
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"the environment variable {name} must be an integer, got {text!r}") from None


def from_env() -> tuple[str, int, int] | None:
    """``(coordinator, num_processes, process_id)`` from ``CBO_JAX_*`` variables, or None."""
    addr = os.environ.get("CBO_JAX_COORDINATOR")
    if not addr:
        return None
    return addr, _env_int("CBO_JAX_NUM_PROCESSES", "1"), _env_int("CBO_JAX_PROCESS_ID", "0")


def is_main() -> bool:
    """True on process 0 (the one that prints and writes results)."""
    return jax.process_index() == 0


def to_host(x) -> np.ndarray:
    """A (possibly multi-host, sharded) array as one NumPy array on every process."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
