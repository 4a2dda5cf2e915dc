"""word-count: a pure map agent (no LLM, no network)."""
