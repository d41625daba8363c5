"""Dumps: deep capture of forwards, the speedscope builder, stored files, the OOM flight recorder."""
