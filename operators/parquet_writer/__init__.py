"""parquet-writer: a producer that writes rows as a deterministic Parquet file, plus an audit log."""
