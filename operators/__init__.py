"""Operators shipped with Keel for MRP jobs: one folder per operator, each with an ``operator.yaml``."""
