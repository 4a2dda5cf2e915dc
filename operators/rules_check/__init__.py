"""rules-check: an evaluator that scores the reduced value against declared rules."""
