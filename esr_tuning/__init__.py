"""Offline tuning: evaluate and fit a routes config on labelled examples."""
