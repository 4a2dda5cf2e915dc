"""flaky: a map agent that fails a set number of times per shard, then succeeds."""
