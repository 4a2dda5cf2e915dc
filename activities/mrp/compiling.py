"""The compile activity's checks, each refusing the job with one ``MrpCompileError``.

- :func:`compile_error`: the non-retryable ``ApplicationError(type=ERROR_COMPILE)`` every
  refusal raises, with ``kind`` and whatever else names the rule or operator.
- :func:`compile_errors`: the compiler's, policy's and registry's own errors mapped to it.
- :func:`refuse_input_sources`: MRP-P015 before anything is listed.
- :func:`resolve_job_inputs`: ``inputs.files`` resolved; S3 refusing the listing refuses
  the job.
- :func:`check_job_sink`: an ``s3://`` sink written and cleaned up before any shard runs.
- :func:`config_fingerprint`: the digest that says whether the parsed MRP config may be
  reused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from temporalio.exceptions import ApplicationError

from activities.mrp.inputs import ResolvedInputs, resolve_inputs
from activities.mrp.operators import (
    OPERATOR_FILE,
    MrpConfig,
    OperatorRefused,
    code_digest,
    read_config_file,
    resolve_config_path,
)
from activities.mrp.records import ScanProgress
from activities.mrp.sinks import SinkWriteError, check_sink
from keel.digest import digest_bytes, digest_json
from keel.mrp.dsl import ParsedJob, destination_problem
from keel.mrp.errors import DslError, InputsRefused, MrpError, RegistryError
from keel.mrp.policy import Caps, PolicyViolation, input_source_findings
from keel.mrp.run import ERROR_COMPILE
from keel.problems import at_path
from keel.settings import Settings
from store.artifacts import ArtifactStore

__all__ = [
    "check_job_sink",
    "compile_error",
    "compile_errors",
    "config_fingerprint",
    "refuse_input_sources",
    "resolve_job_inputs",
]


def compile_error(message: str, **details: Any) -> ApplicationError:
    return ApplicationError(message, details, type=ERROR_COMPILE, non_retryable=True)


@contextlib.contextmanager
def compile_errors() -> Iterator[None]:
    """The errors compiling a job raises, each as :func:`compile_error` with its ``kind``."""
    try:
        yield
    except OperatorRefused as e:
        raise compile_error(str(e), kind="operator", operator=e.operator, reason=e.reason) from None
    except PolicyViolation as e:
        raise compile_error(str(e), kind="policy", rules=e.rule_ids) from None
    except DslError as e:
        raise compile_error(str(e), kind="dsl", issues=[i.model_dump() for i in e.issues]) from None
    except InputsRefused as e:
        raise compile_error(str(e), kind="inputs") from None
    except RegistryError as e:
        raise compile_error(str(e), kind="registry") from None
    except MrpError as e:
        raise compile_error(str(e), kind="mrp") from None


def refuse_input_sources(parsed: ParsedJob, caps: Caps) -> None:
    """MRP-P015 before anything is listed: an ``s3://`` input outside the caps' input
    prefixes is refused without touching the bucket (admission reports it again)."""
    findings = input_source_findings(parsed.spec.inputs, caps)
    if findings:
        path, message = findings[0]
        line = parsed.line(path)
        where = at_path(path, line)
        raise compile_error(
            f"MRP-P015 input source not allowed{where}: {message}",
            kind="policy",
            rules=["MRP-P015"],
        )


def resolve_job_inputs(
    parsed: ParsedJob,
    base_dir: str,
    settings: Settings,
    config: MrpConfig,
    store: ArtifactStore,
    progress: ScanProgress | None = None,
) -> ResolvedInputs:
    """:func:`resolve_inputs`; an S3 bucket or object that does not exist or may not be
    read refuses the job (other S3 errors are worth the activity's retry)."""
    try:
        return resolve_inputs(
            parsed.spec.inputs,
            base_dir=base_dir,
            settings=settings,
            caps=config.caps,
            store=store,
            progress=progress,
        )
    except Exception as e:
        code = str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))
        if code in {"NoSuchBucket", "NoSuchKey", "AccessDenied", "404", "403"}:
            raise InputsRefused(f"inputs.files: S3 refused the listing or read: {e}") from None
        raise


def check_job_sink(settings: Settings, parsed: ParsedJob, caps: Caps, run_id: str) -> None:
    """An ``s3://`` sink written to and cleaned up with the job's credentials, before
    the inputs are scanned or any shard runs: a missing bucket or a missing right
    fails the compile, not the produce step after the map's spend. Only a destination
    the caps admit is touched (one they do not is refused by admission, MRP-P016 or
    the allowed prefixes, without a request to the bucket)."""
    destination = parsed.spec.produce.sink.destination
    if not destination.startswith("s3://") or destination_problem(destination):
        return
    if not any(destination.startswith(p) for p in caps.allowed_destination_prefixes):
        return
    try:
        check_sink(settings, destination, run_id)
    except SinkWriteError as e:
        line = parsed.line("produce.sink.destination")
        where = at_path("produce.sink.destination", line)
        if e.retryable:
            raise ApplicationError(f"sink not reachable{where}: {e}") from None
        raise compile_error(f"sink not writable{where}: {e}", kind="sink") from None


def config_fingerprint(settings: Settings) -> str:
    """A digest of everything ``load_mrp_config`` reads: the config file's bytes, and
    for each operator on its search path the ``operator.yaml`` bytes and the code digest
    (the same hash the pin check uses), plus the environment (the prod key check)."""
    path = resolve_config_path(settings)
    cfg = read_config_file(path)
    base = path.resolve().parent
    parts: list[str] = [settings.env, str(path.resolve()), digest_bytes(path.read_bytes())]
    for rel in cfg.operator_paths:
        for yaml_path in sorted((base / rel).resolve().glob(f"*/{OPERATOR_FILE}")):
            parts += [
                str(yaml_path),
                digest_bytes(yaml_path.read_bytes()),
                code_digest(yaml_path.parent),
            ]
    return digest_json(parts)
