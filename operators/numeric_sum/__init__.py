"""numeric-sum: a Decimal reducer (totals and means, canonical order)."""
