"""The SRL family's runtime: datasets, synthetic-task checks, episode steps (docs/srl.md)."""
