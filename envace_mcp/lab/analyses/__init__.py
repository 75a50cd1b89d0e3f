"""Analyses of the evidence campaign: each reads saved runs (evaluations, training traces) or runs one arm
of an experiment, and prints what it found. Run one as `python -m envace_mcp.lab.analyses.NAME --help`.
Benchmarks against a baseline measured in the same run stay in `benchmarks/`."""
