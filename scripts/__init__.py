"""Thin command lines for the measurements in benchmarks/: run them from the repository root as
``python -m scripts.<name>`` (the Makefile's targets do)."""
