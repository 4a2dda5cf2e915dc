"""Local process management: the Temporal dev server, the local model server, worker and
``keel up`` processes, and the ``keel up`` state file.

``cli/``, ``bench/`` and the tests start and stop what Keel runs on this machine through
this package, so what the tests run is what a user runs. It imports neither ``cli`` nor
``workers``; processes it starts run them as entry points (``python -m cli.keel worker``).
"""
