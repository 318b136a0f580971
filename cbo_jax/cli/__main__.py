"""``python -m cbo_jax.cli``: the ``cbo-jax`` command."""

import sys

from cbo_jax.cli import main

sys.exit(main())
