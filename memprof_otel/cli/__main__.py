"""``python -m memprof_otel.cli``: the same as the ``memprof-otel`` console script."""
import sys

from . import main

sys.exit(main())
