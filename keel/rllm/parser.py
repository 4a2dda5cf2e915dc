"""Parse and validate ``.rllm`` files (format v0.1) into :class:`RllmProgram`.

Layout of a file (docs/rllm-spec.md has the full reference)::

    ---
    <YAML frontmatter>
    ---
    <prompt template>
    === recovery ===
    <recovery prompt template>
    === python name=<id> stage=<pre|post> inputs=<a,b> outputs=<c,d> ===
    <Python code>

Everything is checked at load, so a file that loads can only fail at run time because
of its input, the model, or a Python block: YAML errors carry a line and column, each
frontmatter problem names its key, schemas must be sound JSON Schema (or Picoschema), model
parameters are checked against the allowlist, every template variable must be declared,
and every Python block must compile. The only I/O is :func:`load` reading the file.

The steps live beside it: :mod:`keel.rllm.parse_file` (the limits and where errors point),
:mod:`keel.rllm.parse_frontmatter` (splitting the file, composing and checking the
frontmatter) and :mod:`keel.rllm.parse_body` (the sections, Python blocks and the
variables each template and block may use).
"""

from __future__ import annotations

import os
from typing import Any

from keel.digest import digest_bytes
from keel.problems import located
from keel.rllm.errors import (
    ContextWindowExceededError,
    LLMParamValidationError,
    redact_secrets,
)
from keel.rllm.estimate import check_context_window
from keel.rllm.model import (
    LLMSpec,
    PythonBlock,
    RllmProgram,
    UseSpec,
)
from keel.rllm.params import answer_tokens, validate_llm_params
from keel.rllm.parse_body import (
    _check_refs,
    _check_scopes,
    _python_block,
    _Scope,
    _Section,
    _sections,
)
from keel.rllm.parse_file import (
    MAX_FRONTMATTER_BYTES,
    MAX_FRONTMATTER_DEPTH,
    MAX_FRONTMATTER_NODES,
    MAX_TEMPLATE_REFS,
    MAX_USES,
    _File,
)
from keel.rllm.parse_frontmatter import _check_frontmatter, _check_io_schemas, _compose, _split
from keel.rllm.render import (
    TemplateSyntaxError,
    static_text,
    template_refs,
)


def parse_text(text: str, path: str | os.PathLike[str] | None = None) -> RllmProgram:
    """Parse the text of a ``.rllm`` file; ``path`` only names it in errors and resolves ``uses``.

    Raises:
        ParseError: layout, YAML, sections, template syntax or variables, Python syntax.
        MetadataValidationError: a frontmatter key or a schema is wrong.
        LLMParamValidationError: ``llm_params`` is wrong.
        ContextWindowExceededError: the template alone, plus ``max_tokens``, cannot fit.
    """
    return _parse(text, None if path is None else str(path), digest_bytes(text.encode("utf-8")))


def parse_bytes(raw: bytes, path: str | os.PathLike[str]) -> RllmProgram:
    """Parse the bytes of the ``.rllm`` file at ``path`` (``store.files.load_rllm`` reads
    them). ``source_digest`` is BLAKE3 of the bytes.

    Raises:
        ParseError: the bytes are not UTF-8, plus everything :func:`parse_text` raises.
    """
    f = _File(str(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise f.parse_error(
            f"the file is not UTF-8 (byte {e.start})", line, hint="Save the file as UTF-8."
        ) from None
    return _parse(text, str(path), digest_bytes(raw))


def _checked_params(data: dict[str, Any], f: _File) -> tuple[dict[str, Any], int]:
    """``llm_params`` checked against the allowlist, and the answer's token budget, which
    must leave room for a prompt in ``max_context_window``."""
    params = validate_llm_params(
        data["llm_params"],
        file=f.path or f.name,
        locate=lambda name: f.locate(["llm_params", name]),
    )
    window = data["max_context_window"]
    max_tokens = answer_tokens(params)
    if max_tokens >= window:
        pname = "max_tokens" if "max_tokens" in params else "max_completion_tokens"
        line, column = f.locate(["llm_params", pname])
        raise LLMParamValidationError(
            located(
                f"llm_params.{pname} ({max_tokens}) leaves no room "
                f"for the prompt in max_context_window ({window})",
                f.name,
                line,
                column,
            ),
            details={"file": f.path, "line": line, "column": column, "param": pname},
            received_payload=redact_secrets(params),
            recovery_hint=f"Lower {pname} well below max_context_window.",
        )
    return params, max_tokens


def _body_parts(
    body: list[str], body_line: int, f: _File
) -> tuple[_Section, tuple[str, int] | None, list[PythonBlock]]:
    """The body's prompt section, its recovery text (at most one) and its Python blocks."""
    sections = _sections(body, body_line, f)
    recovery: tuple[str, int] | None = None
    blocks: list[PythonBlock] = []
    for sec in sections[1:]:
        if sec.kind == "recovery":
            if recovery is not None:
                raise f.parse_error("a second '=== recovery ===' section", sec.line)
            recovery = sec.text()
        else:
            blocks.append(_python_block(sec, f))
    return sections[0], recovery, blocks


def _needs_llm(
    data: dict[str, Any],
    prompt: str,
    prompt_line: int,
    recovery: tuple[str, int] | None,
    body_line: int,
    f: _File,
) -> bool:
    """Whether the app asks the model (``output_map`` leaves an output property to it): then
    the prompt must not be empty, else there must be no prompt and no recovery."""
    out_props = list(data["output_schema"]["properties"])
    needs_llm = any(p not in data.get("output_map", {}) for p in out_props)
    if not needs_llm:
        if prompt.strip() or recovery is not None:
            raise f.parse_error(
                "output_map fills every output property, so this app makes no LLM call; "
                "it must have no prompt and no recovery section",
                prompt_line if prompt.strip() else (recovery[1] if recovery else prompt_line),
                hint="Remove the prompt, or leave an output property for the model to answer.",
            )
    elif not prompt.strip():
        raise f.parse_error(
            "the prompt template is empty",
            body_line,
            hint="Write the prompt after the closing '---' of the frontmatter.",
        )
    return needs_llm


def _check_templates(
    prompt: str, prompt_line: int, recovery: tuple[str, int] | None, scope: _Scope, f: _File
) -> None:
    """The prompt and recovery templates: not too many references, valid syntax, and
    every variable in ``scope`` (``__rllm.*`` only in the recovery)."""
    templates = [("prompt", prompt, prompt_line)]
    if recovery is not None:
        templates.append(("recovery", *recovery))
    for where, template, first in templates:
        if template.count("{{") > MAX_TEMPLATE_REFS:
            raise f.parse_error(
                f"the {where} template has more than {MAX_TEMPLATE_REFS} '{{{{'",
                first,
                hint="Pass long or repeated text in as one input variable.",
            )
    try:
        refs = template_refs(prompt, first_line=prompt_line)
        _check_refs(refs, scope, f, where="prompt", recovery=False)
        if recovery is not None:
            refs = template_refs(recovery[0], first_line=recovery[1])
            _check_refs(refs, scope, f, where="recovery", recovery=True)
    except TemplateSyntaxError as e:
        raise f.parse_error(
            e.message,
            e.line,
            e.column,
            hint="Templates only know {{ name }} and {{ name.field }}; write \\{{ for '{{'.",
        ) from None


def _parse(text: str, path: str | None, digest: str) -> RllmProgram:
    f = _File(path)
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    fm, body, body_line = _split(text, f)
    f.root, data = _compose(fm, f)
    data = _check_frontmatter(data, f)
    _check_io_schemas(data, f)
    params, max_tokens = _checked_params(data, f)
    window = data["max_context_window"]
    prompt_sec, recovery, blocks = _body_parts(body, body_line, f)
    scope = _check_scopes(data, blocks, f)
    prompt, prompt_line = prompt_sec.text()
    program_uses = [UseSpec.model_validate(u) for u in data.get("uses", [])]
    needs_llm = _needs_llm(data, prompt, prompt_line, recovery, body_line, f)
    _check_templates(prompt, prompt_line, recovery, scope, f)
    if needs_llm:
        try:
            check_context_window(static_text(prompt), window, max_tokens)
        except ContextWindowExceededError as e:
            e.message = f"{f.name}: the prompt template alone is too long: {e.message}"
            e.details["file"] = f.path
            raise
    try:
        recommended = [LLMSpec.from_string(m) for m in data.get("recommended_models", [])]
    except ValueError as e:  # the frontmatter schema's pattern makes this unreachable
        raise f.meta_error(["recommended_models"], str(e), data=data) from None
    return RllmProgram(
        format_version=data.get("format_version", "0.1"),
        name=data["name"],
        description=data["description"],
        version=data["version"],
        author=data["author"],
        max_context_window=window,
        input_schema=data["input_schema"],
        output_schema=data["output_schema"],
        llm=LLMSpec.model_validate(data["llm"]),
        llm_params=params,
        metadata=data.get("metadata", {}),
        recommended_models=recommended,
        tags=data.get("tags", []),
        uses=program_uses,
        output_map=data.get("output_map", {}),
        output_format=data.get("output_format", "json"),
        structured_output=data.get("structured_output", True),
        prompt_template=prompt + "\n" if prompt else "",
        recovery_template=None if recovery is None else recovery[0] + "\n",
        python_blocks=blocks,
        source_path=path,
        source_digest=digest,
    )


__all__ = [
    "MAX_FRONTMATTER_BYTES",
    "MAX_FRONTMATTER_DEPTH",
    "MAX_FRONTMATTER_NODES",
    "MAX_TEMPLATE_REFS",
    "MAX_USES",
    "parse_bytes",
    "parse_text",
]
