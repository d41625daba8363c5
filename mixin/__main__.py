"""``python -m mixin``: write (or check) the files generated from the mixin's configuration."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import config, outputs

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mixin",
                                 description="Generate memprof-otel's alert rules, PrometheusRule and dashboards.")
    ap.add_argument("--config", type=Path, help="YAML merged over mixin/config.yaml's defaults")
    ap.add_argument("--out", type=Path,
                    help="directory to write into, in the repository's layout (deploy/..., grafana/...); "
                         "default: the repository itself, which only the default config may rewrite")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs")
    args = ap.parse_args(argv)
    if args.config is not None and args.out is None:
        print("error: with --config, pass --out DIR (the repository's files are the default config's)",
              file=sys.stderr)
        return 2
    try:
        cfg = config.load(args.config)
        files = outputs.render(cfg)
    except config.MixinConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    root = args.out if args.out is not None else REPO
    stale = []
    for rel, text in files.items():
        path = root / rel
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python -m mixin", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
