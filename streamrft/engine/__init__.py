"""The compute core shared by the roles: model building and loading, rollout engines, SFT warm-up, algorithms."""
