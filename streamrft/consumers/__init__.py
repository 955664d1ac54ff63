"""The trainer role: consume experiences, train off-policy, publish weight versions."""
