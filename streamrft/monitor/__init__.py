"""Seeing a run: metric loggers, the live dashboard (`dashboard/`), Prometheus endpoints."""
