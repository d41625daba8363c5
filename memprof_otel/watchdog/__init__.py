"""The watchdog: the pure alert engine and the adapter that evaluates it on every sampler tick."""
