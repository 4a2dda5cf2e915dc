"""``design.repair`` (issue 38 §5): a failed validator's findings go back to the step that
made the files. Known fixes first, by rule (``ruff check --fix``, on the host: ruff
reads the files, it runs none of them); then, when the workflow says the decision set's
model may (``RepairInput.use_model``), the codegen model gets the files the remaining
findings name and the findings, and answers with the fixed files as JSON, like codegen's
reply. The next validators round checks the result: an outcome here says who changed
the file a finding names, not that the validator now passes.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeating
from activities.llm import LLMGateway
from keel.design import steps
from keel.design.steps import Finding, FindingOutcome, RepairInput, RepairOutput
from keel.digest import digest_bytes
from keel.llm import LLMMessage, LLMRequest
from store.artifacts import ArtifactStore

#: Whole seconds between heartbeats of a repair (a model answer can take minutes).
HEARTBEAT_EVERY_S = 5.0
#: The most findings one repair hands on (the model's prompt stays small).
MAX_FINDINGS = 200
#: ``path:line[:col]: message``, as ruff (concise), mypy and pytest's tracebacks print.
_LOCATED = re.compile(r"^(?P<file>[\w./-]+\.[A-Za-z0-9]+):(?P<line>\d+)(?::\d+)?:?\s*(?P<msg>.*)$")
#: A file pytest names in a collection error or a traceback.
_PYTEST_FILE = re.compile(r"(?:ERROR collecting |File \")(?P<file>[\w./-]+\.py)")
#: An import that failed: the module, for the missing-package rule.
_NO_MODULE = re.compile(r"No module named '(?P<module>[\w.]+)'")

REPAIR_SYSTEM_PROMPT = (
    "You fix small code repositories. You are given files of a repository and what its "
    "validators (ruff, mypy, pytest, checkov, ...) found in them. Answer with one JSON "
    'object and nothing else: {"files": {path: full fixed file text}} holding only the '
    "files you changed. Keep each file's purpose; do not delete tests."
)


def findings_of(report: Mapping[str, Any], files: Mapping[str, str]) -> list[Finding]:
    """Every finding of the report's failed validators. A validator with a findings list
    (secrets, wiring, actionlint, hadolint) or checkov's failed checks gives one finding
    each; a tool's output (ruff, mypy, pytest) gives one per located line; a failed
    validator with neither gives one finding, its summary."""
    out: list[Finding] = []
    for result in report.get("results", []):
        if result.get("status") != "failed":
            continue
        name = str(result["name"])
        details = result.get("details") or {}
        found: list[Finding] = []
        for item in [*(details.get("findings") or []), *(details.get("failed_checks") or [])]:
            if isinstance(item, dict):
                file = item.get("file") or item.get("file_path")
                file = str(file).lstrip("/") if file else None
                line = item.get("line")
                message = item.get("message") or item.get("rule") or item.get("check_id") or ""
                found.append(
                    Finding(
                        validator=name,
                        file=file,
                        line=line if isinstance(line, int) else None,
                        message=str(message)[:2000],
                    )
                )
        output = str(details.get("output") or "")
        for raw in output.splitlines():
            text = raw.strip()
            m = _LOCATED.match(text)
            if m and m.group("file").lstrip("./") in files:
                found.append(
                    Finding(
                        validator=name,
                        file=m.group("file").lstrip("./"),
                        line=int(m.group("line")),
                        message=m.group("msg")[:2000],
                    )
                )
                continue
            p = _PYTEST_FILE.search(text)
            if p and p.group("file") in files:
                found.append(Finding(validator=name, file=p.group("file"), message=text[:2000]))
            elif _NO_MODULE.search(text):
                found.append(Finding(validator=name, message=text[:2000]))
        if not found:
            found.append(Finding(validator=name, message=str(result.get("summary", ""))[:2000]))
        out.extend(found)
    unique: dict[str, Finding] = {}
    for f in out:
        unique.setdefault(json.dumps(f.model_dump(), sort_keys=True), f)
    return list(unique.values())[:MAX_FINDINGS]


def add_missing_packages(
    files: Mapping[str, str], findings: list[Finding]
) -> tuple[dict[str, str], list[int]]:
    """The known fix of ``No module named 'a.b'`` where ``a/b/`` (or ``a/``) holds
    Python files but no ``__init__.py``: an empty one. The fixed files and the indexes of
    the findings it fixed."""
    out = dict(files)
    fixed: list[int] = []
    for i, f in enumerate(findings):
        m = _NO_MODULE.search(f.message)
        if not m:
            continue
        parts = m.group("module").split(".")
        inits = [f"{'/'.join(parts[:n])}/__init__.py" for n in range(1, len(parts) + 1)]
        for init in inits:
            folder = init.removesuffix("/__init__.py")
            if init not in out and any(
                p.startswith(folder + "/") and p.endswith(".py") for p in out
            ):
                out[init] = ""
        if any(init in out and init not in files for init in inits):
            fixed.append(i)
    return out, fixed


async def ruff_fix(files: Mapping[str, str]) -> tuple[dict[str, str], set[str]]:
    """``ruff check --fix`` over the Python files (on the host, in a temporary
    directory); the files with ruff's fixes applied and the ``file:line`` places ruff
    still reports afterwards. No ruff: the files unchanged and nothing known."""
    from activities.design.validators import _venv_bin

    binary = _venv_bin("ruff")
    if binary is None or not any(p.endswith(".py") for p in files):
        return dict(files), set()
    with tempfile.TemporaryDirectory(prefix="keel-repair-") as tmp:
        root = Path(tmp)
        for path, text in files.items():
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        proc = await asyncio.create_subprocess_exec(
            binary,
            "check",
            "--fix",
            "--no-cache",
            "--output-format",
            "concise",
            ".",
            cwd=root,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
        fixed = {p: (root / p).read_text(encoding="utf-8") for p in files}
    remaining = set()
    for line in out.decode(errors="replace").splitlines():
        m = _LOCATED.match(line.strip())
        if m:
            remaining.add(f"{m.group('file').lstrip('./')}:{m.group('line')}")
    return fixed, remaining


def repair_prompt(files: Mapping[str, str], findings: list[Finding]) -> str:
    """The model's message: the findings and the files they name (all Python files when
    none is named)."""
    named = sorted({f.file for f in findings if f.file and f.file in files})
    if not named:
        named = sorted(p for p in files if p.endswith(".py"))
    body = {
        "findings": [f.model_dump(exclude_none=True) for f in findings],
        "files": {p: files[p] for p in named},
    }
    return "Fix these validator findings:\n" + json.dumps(body, sort_keys=True)


class RepairActivities:
    """``design.repair``, bound to the artifact store and the LLM gateway."""

    def __init__(self, *, artifacts: ArtifactStore, llm: LLMGateway) -> None:
        self.artifacts = artifacts
        self.llm = llm

    @activity.defn(name=steps.REPAIR.name)
    async def repair(self, inp: RepairInput) -> RepairOutput:
        return await heartbeating(self._repair(inp), every_s=HEARTBEAT_EVERY_S)

    async def _repair(self, inp: RepairInput) -> RepairOutput:
        files: dict[str, str] = self.artifacts.get_json(inp.files_digest)
        report = self.artifacts.get_json(inp.report_digest)
        findings = findings_of(report, files)
        if not inp.fix:
            return RepairOutput(
                files_digest=inp.files_digest,
                file_count=len(files),
                file_digests={p: digest_bytes(t.encode()) for p, t in sorted(files.items())},
                findings=findings,
                outcomes=[FindingOutcome(finding=f, fixed_by="not_fixed") for f in findings],
            )
        fixed_by: dict[int, str] = {}
        repaired, packaged = add_missing_packages(files, findings)
        fixed_by.update({i: "rule" for i in packaged})
        ruff_findings = [i for i, f in enumerate(findings) if f.validator == "ruff"]
        if ruff_findings:
            repaired, remaining = await ruff_fix(repaired)
            for i in ruff_findings:
                f = findings[i]
                if (
                    f.file is not None
                    and f"{f.file}:{f.line}" not in remaining
                    and repaired.get(f.file) != files.get(f.file)
                ):
                    fixed_by[i] = "rule"
        left = [f for i, f in enumerate(findings) if i not in fixed_by]
        tokens, model = 0, ""
        if left and inp.use_model:
            answer, tokens, model = await self._ask_model(inp, repaired, left)
            for path, text in answer.items():
                repaired[path] = text
            for i, f in enumerate(findings):
                if i in fixed_by:
                    continue
                if f.file is None or (f.file in answer and answer[f.file] != files.get(f.file)):
                    # No file named: the model saw every Python file and answered.
                    fixed_by[i] = "model" if answer else "not_fixed"
        changed = sorted(p for p in repaired if repaired[p] != files.get(p))
        digest = self.artifacts.put_json(repaired) if changed else inp.files_digest
        return RepairOutput(
            files_digest=digest,
            file_count=len(repaired),
            file_digests={p: digest_bytes(t.encode()) for p, t in sorted(repaired.items())},
            files_changed=changed,
            findings=findings,
            outcomes=[
                FindingOutcome(finding=f, fixed_by=fixed_by.get(i, "not_fixed"))  # type: ignore[arg-type]
                for i, f in enumerate(findings)
            ],
            model=model,
            tokens_total=tokens,
        )

    async def _ask_model(
        self, inp: RepairInput, files: Mapping[str, str], findings: list[Finding]
    ) -> tuple[dict[str, str], int, str]:
        """The model's fixed files (checked like codegen's answer), its tokens and name."""
        from activities.design.codegen import CodeGenError, parse_file_map

        info = activity.info()
        response = await self.llm.call(
            LLMRequest(
                model=inp.model,
                messages=[
                    LLMMessage(role="system", content=REPAIR_SYSTEM_PROMPT),
                    LLMMessage(role="user", content=repair_prompt(files, findings)),
                ],
                params={"max_tokens": 8192, "temperature": 0},
                json_mode=True,
                timeout_s=300.0,
            ),
            call_key=f"{inp.key}/{info.attempt}",
            workflow_id=info.workflow_id,
            meter=None,
        )
        try:
            answer = parse_file_map(response.content)
        except CodeGenError as exc:
            raise ApplicationError(
                f"the model's repair is not a usable files map: {str(exc)[:2000]}",
                type=steps.ERROR_DESIGN_CODEGEN,
            ) from None
        return answer, response.usage.total_tokens, response.model_name
