"""json-writer: a producer that writes the reduced value as canonical JSON, plus an audit log."""
