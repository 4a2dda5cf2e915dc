"""Activities of the design family (issue 9)."""
