"""The runtime around the maths: results directories, files, checkpoints, reports, processes.

Nothing here changes a number a run computes; it decides where the numbers go and what is
recorded with them.

* :mod:`~cbo_jax.runtime.writer`: ``metrics.jsonl`` (and TensorBoard), ``summary.json``,
  files replaced whole or not at all;
* :mod:`~cbo_jax.runtime.checkpoint`: checkpoints of any run state (orbax), verified on restore;
* :mod:`~cbo_jax.runtime.provenance`: the ``environment`` block of ``summary.json``;
* :mod:`~cbo_jax.runtime.report`: a results directory rendered as one HTML or Markdown page;
* :mod:`~cbo_jax.runtime.compilation_cache`: JAX's persistent compilation cache;
* :mod:`~cbo_jax.runtime.distributed`: several processes (hosts), one program;
* :mod:`~cbo_jax.runtime.notebook`: helpers for the example notebooks and the script → notebook
  converter.

Internal (no stable surface): ``results`` (a results directory that one run owns, disk-full and
symbolic-link refusals), ``progress`` (progress bars, the run's stopwatch), ``display`` (short
text forms of results) and ``plotting`` (figures written to files without pyplot).

Their deprecated names ``cbo_jax.writer``, ``cbo_jax.checkpoint``, ... import them too, with a
:class:`DeprecationWarning` (``cbo_jax.runtime._moved``). ``cbo_jax.checkpoint``
and ``cbo_jax.writer`` stay attributes of the package (``cj.checkpoint.save``).

This package's ``__init__`` imports nothing: importing one of its modules costs that module.
"""
