"""slow: a map agent that sleeps per shard (for kill and timeout tests)."""
