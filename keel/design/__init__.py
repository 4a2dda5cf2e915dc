"""The design family's pure domain: constraints to a reviewed, costed, explained plan.

Everything here is deterministic and free of I/O, so the ``DesignPipeline`` workflow can
run these functions inside the workflow sandbox and replay them. Data (capability
patterns, the price table, prompt texts) is loaded by the caller and passed in.
``docs/design.md`` describes the model.
"""
