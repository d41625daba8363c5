"""What memprof-otel gives a test suite: the pytest plugin, registered through the ``pytest11`` entry
point (nothing to import). Imports only ``baselines`` and the core at load: pytest loads it in every
session where the package is installed.

``pytest_plugin.py`` ``memprof_baseline``, ``--memprof-update-baselines``, ``memprof_baselines_dir``

Public: that fixture, option and ini option (docs/reference.md, Baselines). The module path is
internal.
"""
