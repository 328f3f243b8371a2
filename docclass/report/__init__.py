"""Run reports: figures and summaries written next to a run's outputs."""
