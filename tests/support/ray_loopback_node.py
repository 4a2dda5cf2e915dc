"""``ray start`` for a node that joins a cluster on this host's loopback and stays there.

Run as ``python -m tests.support.ray_loopback_node start --address=127.0.0.1:PORT ...``.

Ray has two modes. In cluster mode (the Linux default) a node resolves
``--node-ip-address=127.0.0.1`` to the host's network IP and its servers (GCS, raylet,
agents) listen on every interface. With ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` every server
binds 127.0.0.1, which is what a test wants, but ``ray start`` then refuses to add a second
node (a guard meant for Windows and macOS). This launcher passes that guard and keeps the
node's address on loopback; the processes the node starts inherit the loopback mode.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def main() -> None:
    from ray._private import ray_constants, services
    from ray.scripts import scripts

    def loopback_ip(address: Any = None) -> str:
        import ray

        node = ray._private.worker._global_node
        return str(node.node_ip_address) if node is not None else "127.0.0.1"

    ray_constants.ENABLE_RAY_CLUSTER = True  # passes ray start's guard for a second node
    services.get_node_ip_address = loopback_ip  # and 127.0.0.1 stays 127.0.0.1
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # for what the node starts
    sys.argv = ["ray", *sys.argv[1:]]
    scripts.main()


if __name__ == "__main__":
    main()
