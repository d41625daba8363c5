"""Test doubles for hardware we cannot assume (each named as such in its docstring)."""
