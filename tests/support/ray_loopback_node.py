"""``ray start`` for a test node on this host's loopback, patient with a loaded host.

Run as ``python -m tests.support.ray_loopback_node start ...``; with
``KEEL_TEST_RAY_JOINS=1`` the node joins a cluster (``--address=127.0.0.1:PORT``).

Ray has two modes. In cluster mode (the Linux default) a node resolves
``--node-ip-address=127.0.0.1`` to the host's network IP and its servers (GCS, raylet,
agents) listen on every interface. With ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` every server
binds 127.0.0.1, which is what a test wants, but ``ray start`` then refuses to add a second
node (a guard meant for Windows and macOS). For a joining node this launcher passes that
guard and keeps the node's address on loopback; the processes the node starts inherit the
loopback mode.

Every node it starts waits longer for its raylet to register with the GCS: Ray gives that
30 s, fixed in ``Node.__init__``, and on CI's 2-core machine, with the rest of the suite
beside it, a head missed it twice in a row (2026-11-28: "The current node timed out during
startup", each ``get_node`` answered "Deadline Exceeded"). Here each of Ray's tries keeps
asking for up to :data:`REGISTER_WAIT_S`.

Its raylet is also told the dashboard agent's listen port (``KEEL_TEST_RAY_AGENT_LISTEN_PORT``,
the port ``--dashboard-agent-listen-port`` gave the agent), which ``ray start`` does not
pass on: without it the raylet waits for the agent to write that port to a file, a fixed
15 to 30 s, and dies of a failed check when the agent's Python start is slower (see
``tests.support.ray_cluster.agent_ports``).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

REGISTER_WAIT_S = 150.0


def main() -> None:
    from ray._private import ray_constants, services
    from ray.scripts import scripts

    get_node = services.get_node

    def patient_get_node(gcs_address: Any, node_id: Any) -> Any:
        deadline = time.monotonic() + REGISTER_WAIT_S
        while True:
            try:
                return get_node(gcs_address, node_id)
            except RuntimeError:  # not registered yet, or the GCS did not answer in time
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    services.get_node = patient_get_node

    listen_port = os.environ.pop("KEEL_TEST_RAY_AGENT_LISTEN_PORT", "")
    if listen_port:
        start_ray_process = services.start_ray_process

        def start_with_listen_port(command: list[str], *args: Any, **kwargs: Any) -> Any:
            if command and command[0] == services.RAYLET_EXECUTABLE:
                command = [*command, f"--dashboard_agent_listen_port={listen_port}"]
            return start_ray_process(command, *args, **kwargs)

        services.start_ray_process = start_with_listen_port

    if os.environ.get("KEEL_TEST_RAY_JOINS") == "1":

        def loopback_ip(address: Any = None) -> str:
            import ray

            node = ray._private.worker._global_node
            return str(node.node_ip_address) if node is not None else "127.0.0.1"

        ray_constants.ENABLE_RAY_CLUSTER = True  # passes ray start's guard for a second node
        services.get_node_ip_address = loopback_ip  # and 127.0.0.1 stays 127.0.0.1
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # for what the node starts
    os.environ.pop("KEEL_TEST_RAY_JOINS", None)
    sys.argv = ["ray", *sys.argv[1:]]
    scripts.main()


if __name__ == "__main__":
    main()
