"""Stream ops: stateless per-message scoring, advantages, filtering and priority between rollouts and experiences."""
