"""Measurements and their helpers, outside the installed package: speed, memory, accuracy
anchors, seed spreads. Run through the thin ``scripts/`` (see the Makefile); never unit tests."""
