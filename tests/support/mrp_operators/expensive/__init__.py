"""expensive: a map agent with a high cost weight that also charges metered units."""
