"""amount-stats: a pure numeric map agent (Decimal count/sum/min/max per shard)."""
