"""Rule ``objects``, the pipeline's store: the runtimes of one region that run pipeline
steps share one store.

A generated pipeline passes its data from step to step through one object store,
``DATA_URI`` (``s3://<bucket>/<prefix>``): the transform lands ``raw/``, the feature step
builds ``features/``, the training reads both and publishes the model, serving and the
drift check read what the training published. Each runtime is handed its store by the
Terraform: a task definition's, function's or SageMaker job's ``DATA_URI``, a script
job's ``--data_uri``. When those name different buckets nothing a step writes reaches the
next: generated designs had the Glue transform land ``raw/`` in its own module's bucket
while the training read the models bucket, where nothing wrote.

A store is resolved to the bucket resource it names: ``aws_s3_bucket.<name>`` of the
runtime's module instance, or, through a module variable, the root's argument
``module.<instance>.<output>[i]``, the ``i``-th ``aws_s3_bucket`` of that output in the
called module's ``outputs.tf`` (``data_bucket_names``, ``data_bucket_arns``; wrapped in
``split(":::", ...)[1]`` for an ARN). A store that cannot be resolved is not compared.
Runtimes are grouped by region: module instances are named ``<capability>_<region id>``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator

from keel.design.wiring.images import runtimes
from keel.design.wiring.model import Finding, Instance
from keel.design.wiring.objects import env_s3, parse_s3
from keel.design.wiring.repo import Repo
from keel.design.wiring.scripts import job_runs

_VAR = re.compile(r"\bvar\.(\w+)")
_MODULE_OUT = re.compile(r"\bmodule\.(\w+)\.(\w+)(?:\[(\d+)\])?")
_BUCKET = re.compile(r"\baws_s3_bucket\.(\w+)\b")
_OUTPUT = re.compile(r'output\s+"(\w+)"\s*\{[^}]*?\bvalue\s*=\s*([^\n]+)', re.S)

#: (module instance, bucket resource) or, for a literal bucket name, ("", name).
Store = tuple[str, str]


def _outputs(repo: Repo, directory: str) -> dict[str, str]:
    text = "\n".join(
        t for p, t in repo.files.items() if p.rsplit("/", 1)[0] == directory and p.endswith(".tf")
    )
    return {m.group(1): m.group(2).strip() for m in _OUTPUT.finditer(text)}


def _instance_name(inst: Instance) -> str:
    return inst.block.name if inst.block is not None else inst.root


def _bucket_of(repo: Repo, inst: Instance, uri: str) -> tuple[Store, str] | None:
    """The bucket a ``DATA_URI`` of ``inst`` names and its prefix, or None."""
    parsed = parse_s3(uri)
    if parsed is None:
        return None
    bucket, key = parsed
    prefix = "/" + key.strip("/")
    if not bucket.startswith("${"):
        return ("", bucket), prefix
    expr = bucket.removeprefix("${").removesuffix("}")

    def arg(v: re.Match[str]) -> str:
        got = inst.args.get(v.group(1))
        return str(got).removeprefix("${").removesuffix("}") if isinstance(got, str) else v.group(0)

    expr = _VAR.sub(arg, expr)
    called = _MODULE_OUT.search(expr)
    if called is not None:
        name, output, index = called.group(1), called.group(2), called.group(3)
        # An index after the substituted argument: var.x[0] became module.m.o[0].
        target = next(
            (i for i in repo.instances if i.block is not None and i.block.name == name), None
        )
        if target is None:
            return None
        value = _outputs(repo, target.module.dir).get(output, "")
        buckets = _BUCKET.findall(value)
        at = int(index) if index is not None else 0
        if at >= len(buckets):
            return None
        return (name, buckets[at]), prefix
    local = _BUCKET.search(expr)
    if local is None:
        return None
    return (_instance_name(inst), local.group(1)), prefix


def _region(inst_name: str) -> str:
    return inst_name.split("_", 1)[1] if "_" in inst_name else ""


def _stores(repo: Repo) -> Iterator[tuple[str, str, str, tuple[Store, str]]]:
    """(region, runtime, file, (store, prefix)) for each runtime handed a store."""
    for rt in runtimes(repo):
        if rt.scheduled:
            continue  # its task definition's store
        uri = env_s3(rt.block.body).get("DATA_URI")
        for inst in repo.instances_of(rt.module):
            found = _bucket_of(repo, inst, uri) if uri else None
            if found is not None:
                yield _region(_instance_name(inst)), rt.where, rt.block.file, found
    for run in job_runs(repo):
        uri = run.args.get("data_uri", "").strip('"')
        for inst in repo.instances_of(run.module):
            found = _bucket_of(repo, inst, uri) if uri else None
            if found is not None:
                yield _region(_instance_name(inst)), run.where, run.block.file, found


def check_stores(repo: Repo) -> list[Finding]:
    by_region: dict[str, dict[tuple[Store, str], set[tuple[str, str]]]] = defaultdict(
        lambda: defaultdict(set)
    )
    for region, where, file, store in _stores(repo):
        by_region[region][store].add((where, file))
    out: list[Finding] = []
    for region, stores in sorted(by_region.items()):
        if len(stores) < 2:
            continue
        # Reported where the fewest runtimes use a store: the odd one out.
        ranked = sorted(stores.items(), key=lambda kv: (len(kv[1]), sorted(kv[1])))
        shown = "; ".join(
            f"{_shown(store)} ({', '.join(sorted(w for w, _ in users))})"
            for store, users in sorted(stores.items(), key=lambda kv: _shown(kv[0]))
        )
        file = sorted(f for _, f in ranked[0][1])[0]
        out.append(
            Finding(
                "objects",
                file,
                f"the pipeline's runtimes{' in ' + region if region else ''} use "
                f"{len(stores)} stores: {shown}: what a step writes in one store the next "
                "step never reads in another",
            )
        )
    return out


def _shown(key: tuple[Store, str]) -> str:
    (inst, bucket), prefix = key
    return (
        f"s3://<module.{inst}.aws_s3_bucket.{bucket}>{prefix}" if inst else f"s3://{bucket}{prefix}"
    )
