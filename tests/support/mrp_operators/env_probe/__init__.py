"""env-probe (tests only): reports what of the worker's environment its process can see."""
