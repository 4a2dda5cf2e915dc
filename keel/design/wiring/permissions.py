"""Rule ``permissions``: every AWS call the code a runtime starts makes is allowed by the
runtime's role, and every AWS SDK call a Step Functions state makes by its state machine's.

Only the calls of :data:`AWS_CALLS` are checked (a call whose action a generated role
missed: Bedrock's Converse from the RAG function; SageMaker's CreateModelPackage from a
training job whose role lacked it). The role is the Lambda function's ``role``, the task
definition's ``task_role_arn``, a SageMaker job's ``RoleArn`` or model's execution role,
a script job's (:mod:`.scripts`: a Glue job's ``role_arn``, an EMR Serverless job run's
``ExecutionRoleArn``), whose code is its script and what that imports.
A state machine's ``arn:aws:states:::aws-sdk:<service>:<api>`` Task states need the IAM
actions of :data:`SFN_SDK_ACTIONS` (else ``<service>:<Api>``) from its ``role_arn``'s role.
What a role may do is the ``Action`` of
the policies the module attaches to it (``aws_iam_role_policy``, ``inline_policy``, an
``aws_iam_policy`` of the module attached by ``aws_iam_role_policy_attachment``), with
``*`` wildcards. A policy from outside the module (a variable, an AWS managed policy) is
not read: an action only it grants is reported.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import re

from keel.design.wiring.code import _parsed, import_closure, module_file
from keel.design.wiring.images import Runtime, image_code, runtimes
from keel.design.wiring.lambdas import Package, archives
from keel.design.wiring.model import Block, Finding, TfModule
from keel.design.wiring.repo import Repo
from keel.design.wiring.scripts import job_runs
from keel.design.wiring.terraform import _all_text

#: (boto3 service, method) -> the IAM action the call needs.
AWS_CALLS: dict[tuple[str, str], str] = {
    ("bedrock-runtime", "converse"): "bedrock:InvokeModel",
    ("bedrock-runtime", "invoke_model"): "bedrock:InvokeModel",
    ("bedrock-runtime", "converse_stream"): "bedrock:InvokeModelWithResponseStream",
    ("bedrock-runtime", "invoke_model_with_response_stream"): (
        "bedrock:InvokeModelWithResponseStream"
    ),
    ("sagemaker", "create_model_package"): "sagemaker:CreateModelPackage",
    ("cloudwatch", "put_metric_data"): "cloudwatch:PutMetricData",
}

#: Step Functions AWS SDK integrations whose IAM actions are not ``<service>:<Api>``.
SFN_SDK_ACTIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("s3", "copyObject"): ("s3:GetObject", "s3:PutObject"),
    ("s3", "listObjectsV2"): ("s3:ListBucket",),
    ("s3", "listObjects"): ("s3:ListBucket",),
    ("s3", "headObject"): ("s3:GetObject",),
}
_SDK_TASK = re.compile(r"arn:aws:states:::aws-sdk:([a-z0-9-]+):([A-Za-z0-9]+)")

_ACTION = re.compile(r'"([a-z0-9-]+:[A-Za-z0-9*?]+)"|^([a-z0-9-]+:[A-Za-z0-9*?]+)$')
_ROLE_REF = re.compile(r"aws_iam_role\.(\w+)\.")
_POLICY_REF = re.compile(r"aws_iam_policy\.(\w+)\.")


@functools.lru_cache(maxsize=1024)
def _calls(path: str, text: str) -> tuple[tuple[str, int], ...]:
    """The actions of :data:`AWS_CALLS` a file needs: a ``boto3.client("<service>")`` (or
    ``session.client``) in the file and a call of one of that service's methods, with the
    call's line."""
    tree = _parsed(text)
    if tree is None:
        return ()
    services: set[str] = set()
    methods: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr == "client" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                services.add(first.value)
        else:
            methods.append((node.func.attr, node.lineno))
    out = {
        (AWS_CALLS[(s, m)], line) for m, line in methods for s in services if (s, m) in AWS_CALLS
    }
    return tuple(sorted(out))


def _role(mod: TfModule, rt: Runtime) -> Block | None:
    if rt.kind == "sagemaker" or rt.role:
        text = rt.role
    else:
        text = _all_text(rt.block.body.get("role" if rt.kind == "lambda" else "task_role_arn", ""))
    m = _ROLE_REF.search(text)
    return mod.resource("aws_iam_role", m.group(1)) if m else None


def _actions(text: str) -> set[str]:
    found: set[str] = set()
    for m in _ACTION.finditer(text):
        found.add(m.group(1) or m.group(2))
    return found


def _granted(mod: TfModule, role: Block) -> set[str]:
    """The actions the module's policies give ``role``."""
    text = [_all_text(role.body.get("inline_policy", ""))]
    for block in mod.resources:
        target = _ROLE_REF.search(_all_text(block.body.get("role", "")))
        if target is None or target.group(1) != role.name:
            continue
        if block.kind == "aws_iam_role_policy":
            text.append(_all_text(block.body.get("policy", "")))
        elif block.kind == "aws_iam_role_policy_attachment":
            ref = _POLICY_REF.search(_all_text(block.body.get("policy_arn", "")))
            policy = mod.resource("aws_iam_policy", ref.group(1)) if ref else None
            if policy is not None:
                text.append(_all_text(policy.body.get("policy", "")))
    actions: set[str] = set()
    for t in text:
        for line in t.splitlines():
            actions |= _actions(line.strip())
    return actions


def runtime_files(repo: Repo, rt: Runtime) -> list[str]:
    """The repository files ``rt`` starts (its handler's module, or its images' entry points)."""
    if rt.handler:
        module = rt.handler.rsplit(".", 1)[0]
        starts = []
        for pkg in archives(
            repo, rt.module, {k: rt.block.body.get(k) for k in ("filename", "s3_key")}
        ) or [Package(".", (), "")]:
            path = module_file(repo.files, module, pkg.root) if pkg.root else None
            if path is not None:
                starts.append(path)
        return starts
    out: list[str] = []
    for image in rt.images:
        code = image_code(repo, rt, image)
        if code is not None:
            out += code[0]
    return out


def _sdk_findings(mod: TfModule) -> list[Finding]:
    """Each AWS SDK Task state of a state machine needs its actions from the machine's role."""
    out: list[Finding] = []
    for block in mod.of_kind("aws_sfn_state_machine"):
        definition = _all_text(block.body.get("definition", ""))
        calls = sorted(set(_SDK_TASK.findall(definition)))
        if not calls:
            continue
        m = _ROLE_REF.search(_all_text(block.body.get("role_arn", "")))
        role = mod.resource("aws_iam_role", m.group(1)) if m else None
        granted = _granted(mod, role) if role is not None else set()
        role_name = f"aws_iam_role.{role.name}" if role is not None else "no role of the module"
        for service, api in calls:
            needed = SFN_SDK_ACTIONS.get((service, api), (f"{service}:{api[:1].upper()}{api[1:]}",))
            for action in needed:
                if any(fnmatch.fnmatchcase(action, g) for g in granted):
                    continue
                out.append(
                    Finding(
                        "permissions",
                        block.file,
                        f"aws_sfn_state_machine.{block.name} calls {action} (a Task state's "
                        f"arn:aws:states:::aws-sdk:{service}:{api}), which its role "
                        f"({role_name}) is not allowed: no policy of the module grants it",
                    )
                )
    return out


def _call_findings(
    repo: Repo, mod: TfModule, block: Block, where: str, starts: list[str], role_text: str
) -> list[Finding]:
    """The calls of :data:`AWS_CALLS` the code ``starts`` imports makes that the role
    ``role_text`` names (``aws_iam_role.<name>``) is not granted in ``mod``."""
    needed: dict[str, str] = {}
    for path in import_closure(repo.files, starts):
        for action, line in _calls(path, repo.files[path]):
            needed.setdefault(action, f"{path}:{line}")
    if not needed:
        return []
    m = _ROLE_REF.search(role_text)
    role = mod.resource("aws_iam_role", m.group(1)) if m else None
    granted = _granted(mod, role) if role is not None else set()
    role_name = f"aws_iam_role.{role.name}" if role is not None else "no role of the module"
    return [
        Finding(
            "permissions",
            block.file,
            f"{where} calls {action} ({needed[action]}), which its role "
            f"({role_name}) is not allowed: no policy of the module grants it",
        )
        for action in sorted(needed)
        if not any(fnmatch.fnmatchcase(action, g) for g in granted)
    ]


def check_permissions(repo: Repo) -> list[Finding]:
    out: list[Finding] = []
    for mod in repo.modules.values():
        out += _sdk_findings(mod)
    for rt in runtimes(repo):
        role = _role(rt.module, rt)
        role_text = f"aws_iam_role.{role.name}." if role is not None else ""
        out += _call_findings(
            repo, rt.module, rt.block, rt.where, runtime_files(repo, rt), role_text
        )
    # Script jobs: a Glue job's role_arn, an EMR job run's ExecutionRoleArn.
    for run in job_runs(repo):
        if run.script is not None:
            out += _call_findings(repo, run.module, run.block, run.where, [run.script], run.role)
    return out
