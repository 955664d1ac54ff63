"""Launching a whole run on one machine: prepare the model and data, start every role, watch."""
