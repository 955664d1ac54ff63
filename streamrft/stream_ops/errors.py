"""The errors that make one record a dead letter in stream ops, named so (`error_type`) in it."""
from __future__ import annotations


class ScoringError(RuntimeError):
    """A reward or advantage function failed (raised, or returned a non-finite value) on this group."""

    def __init__(self, reason: str, error_type: str = ""):
        self.reason = reason
        self.error_type = error_type or type(self).__name__
        super().__init__(reason)


class RecordRejected(ScoringError):
    """An op dead-letters the whole record (its reason names the op)."""
