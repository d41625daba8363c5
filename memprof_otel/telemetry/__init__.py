"""Process telemetry: the sampler, operations and their stats, the series every exporter reads."""
