"""sentiment-label: an LLM-backed map agent (one label per item through ctx.llm)."""
