"""Seeing a run: metric loggers (TensorBoard, W&B, MLflow), Prometheus endpoints, progress bars, the live
dashboard (`dashboard/`)."""
