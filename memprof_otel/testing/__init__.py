"""What memprof-otel gives a test suite: the pytest plugin (``pytest_plugin.py``)."""
