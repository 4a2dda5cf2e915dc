"""The use cases: what ``cli/`` and ``api/`` call for each action (they parse and print or
answer; the deciding is here), and what ``bench/`` and the tests start runs with.

- ``client.temporal``: connect (pydantic converter, tracing when on), start by workflow
  type, describe-or-none, the failure cause chain, the status names; ``client.memos``: a
  run's memo as a type; ``client.readers``: run lists and progress from visibility rows.
- One module per family: ``client.gate``, ``client.mrp``, ``client.rllm``, ``client.srl``
  (with ``client.srl_export``, the export file formats) and ``client.design`` (with
  ``design_cases``, ``design_files``, ``design_view`` and ``design_refusals``).
- ``client.waiting``: waiting for a run beside the services a command started.

Nothing here imports ``workers``, ``activities`` or ``services``: a client never needs
workflow or activity code, and the services it waits beside come in as an argument.
"""
