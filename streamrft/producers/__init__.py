"""Producers: explorers that turn tasks into RolloutGroups, and the data sources that feed them."""
