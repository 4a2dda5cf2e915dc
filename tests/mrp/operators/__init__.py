"""MRP test operators of this family's own tests (signed with the dev key): ``memory-hog``
(a map that allocates past its shard's memory limit on the shards it is told to) and
``stream-sum`` (a streaming reducer).

``mrp.yaml`` here is their config: the shipped operators plus these.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "mrp.yaml"
