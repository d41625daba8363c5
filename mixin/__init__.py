"""memprof-otel's monitoring mixin: alert rules, PrometheusRule and Grafana dashboards generated
from one configuration (mixin/config.yaml holds the documented defaults).

    python -m mixin                                   # rewrite the shipped files (default config)
    python -m mixin --check                           # exit 1 if a shipped file is out of date
    python -m mixin --config mine.yaml --out build/   # your own variant, under build/

Not part of the installed package: it runs from a source checkout and needs only PyYAML.
"""
