"""Plumbing: the embedded stack, Kafka clients and admin, the object store, health checks."""
