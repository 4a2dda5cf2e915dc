"""Temporal client helpers shared by ``cli/``, ``api/``, ``bench/`` and the tests.

``client.temporal``: connect (pydantic converter, tracing when on), start by workflow type,
describe-or-none, the failure cause chain, the status names. ``client.mrp`` and
``client.rllm``: each family's calls and its view of a run. Nothing here imports
``workers``: a client never needs workflow or activity code.
"""
