"""Pure per-layer accounting: no torch, no threads. The torch adapter lives in ``instrument``."""
