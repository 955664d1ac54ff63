"""Rewards that arrive later (issue 31): ratings on `<ns>.feedback.<team>` joined with the groups
they rate. `aggregate.py`: a trajectory's reward from its ratings (mean, majority label,
Bradley-Terry from preferences); `join.py`: the parked groups and the ratings waiting for them,
and what is ready or timed out. docs/feedback.md says what is built and what is planned.
"""
