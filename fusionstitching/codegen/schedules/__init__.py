"""Schedules: a flattened pattern mapped onto threads and emitted as kernel IR (paper 4.2)."""
