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
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Sequence
from typing import Any

import yaml

from keel.digest import digest_bytes
from keel.problems import located
from keel.rllm.errors import (
    REDACTED,
    ContextWindowExceededError,
    LLMParamValidationError,
    MetadataValidationError,
    ParseError,
    redact_secrets,
)
from keel.rllm.estimate import check_context_window
from keel.rllm.model import (
    FRONTMATTER_SCHEMA,
    IDENT_PATTERN,
    LLMSpec,
    PythonBlock,
    RllmProgram,
    UseSpec,
)
from keel.rllm.params import answer_tokens, validate_llm_params
from keel.rllm.picoschema import PicoschemaError, compile_picoschema, is_json_schema
from keel.rllm.render import (
    RECOVERY_FIELDS,
    RESERVED_ROOT,
    TemplateRef,
    TemplateSyntaxError,
    static_text,
    template_refs,
)
from keel.rllm.schema import (
    NOT_ALLOWED,
    SCHEMA_META_SCHEMA,
    ValidationIssue,
    check_schema,
    json_type_of,
    resolve_local,
    validate_instance,
)
from keel.yaml_limits import BoundedComposerMixin, YamlLimitError

_SECTION = re.compile(r"^===[ \t]*([A-Za-z].*?)[ \t]*===[ \t]*$")
_IDENT = re.compile(IDENT_PATTERN)
_BLOCK_KEYS = ("name", "stage", "inputs", "outputs")
_FRONTMATTER_FIRST_LINE = 2
_MISSING = object()

# Limits on the frontmatter, far above what an app needs, so that parsing one file (in the
# API, the CLI or a worker) stays a matter of milliseconds: without them 50,000 nested
# brackets are a RecursionError and nine levels of YAML anchors expand to 9**9 nodes.
MAX_FRONTMATTER_BYTES = 256 * 1024
MAX_FRONTMATTER_DEPTH = 64
MAX_FRONTMATTER_NODES = 10_000
MAX_USES = 100
# Each reference is checked and located; more than this many '{{' is no real template.
MAX_TEMPLATE_REFS = 10_000

PathParts = Sequence[str | int]


def _key(parts: PathParts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _json_path_parts(path: str) -> list[str | int]:
    """``$.uses[0].alias`` -> ``['uses', 0, 'alias']``."""
    parts: list[str | int] = []
    # '*', not '+': an empty key is a key too ('$.' is the path of key '').
    for m in re.finditer(r"\.([^.\[\]]*)|\[(\d+)\]", path.removeprefix("$")):
        parts.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
    return parts


def _suggest(word: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _File:
    """Where errors point: the file name and the composed YAML tree for line lookups."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.name = path or "<text>"
        self.root: yaml.Node | None = None

    def locate(self, parts: PathParts) -> tuple[int, int]:
        """File line and column of a frontmatter key (the deepest part that exists)."""
        node = self.root
        if node is None:
            return _FRONTMATTER_FIRST_LINE, 1
        pos = node.start_mark
        for part in parts:
            nxt = None
            if isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    if k.value == str(part):
                        pos, nxt = k.start_mark, v
                        break
            elif (
                isinstance(node, yaml.SequenceNode)
                and isinstance(part, int)
                and 0 <= part < len(node.value)
            ):
                nxt = node.value[part]
                pos = nxt.start_mark
            if nxt is None:
                break
            node = nxt
        return pos.line + _FRONTMATTER_FIRST_LINE, pos.column + 1

    def parse_error(
        self, message: str, line: int, column: int = 1, *, hint: str | None = None, **extra: Any
    ) -> ParseError:
        return ParseError(
            located(message, self.name, line, column),
            details={"file": self.path, "line": line, "column": column, **extra},
            recovery_hint=hint,
        )

    def meta_error(
        self,
        parts: PathParts,
        message: str,
        *,
        expected_schema: dict[str, Any] | None = None,
        received: Any = _MISSING,
        data: Any = None,
        hint: str | None = None,
        **extra: Any,
    ) -> MetadataValidationError:
        line, column = self.locate(parts)
        key = _key(parts) or "(frontmatter)"
        if received is _MISSING:
            received = _value_at(data, parts)
        return MetadataValidationError(
            located(f"{key}: {message}", self.name, line, column),
            details={"file": self.path, "line": line, "column": column, "key": key, **extra},
            expected_schema=expected_schema,
            received_payload=None if received is _MISSING else _redact_at(parts, received),
            recovery_hint=hint,
        )


def _redact_at(parts: PathParts, value: Any) -> Any:
    # The value of a key named like a secret is hidden even when it is the key at fault.
    last = parts[-1] if parts else ""
    if isinstance(last, str) and redact_secrets({last: None}) != {last: None}:
        return REDACTED
    return redact_secrets(value)


def _value_at(data: Any, parts: PathParts) -> Any:
    for p in parts:
        found = (isinstance(data, dict) and p in data) or (
            isinstance(data, list) and isinstance(p, int) and 0 <= p < len(data)
        )
        if not found:
            return _MISSING
        data = data[p]
    return data


def _schema_at(schema: dict[str, Any], parts: PathParts) -> dict[str, Any]:
    """The part of the frontmatter schema that describes the key at ``parts``."""
    for p in parts:
        if isinstance(p, int):
            nxt = schema.get("items")
        else:
            nxt = schema.get("properties", {}).get(p, schema.get("additionalProperties"))
        if not isinstance(nxt, dict):
            return schema
        schema = nxt
    return schema


# ---------------------------------------------------------------- splitting the file


def _split(text: str, f: _File) -> tuple[str, list[str], int]:
    """Frontmatter text, body lines, and the file line the body starts on."""
    lines = text.split("\n")
    if not lines or lines[0].rstrip() != "---":
        raise f.parse_error(
            "a .rllm file must start with a '---' line that opens the YAML frontmatter",
            1,
            hint="Put '---' on the first line, the metadata below it, and '---' again after it.",
        )
    for k in range(1, len(lines)):
        if lines[k].rstrip() == "---":
            return "\n".join(lines[1:k]), lines[k + 1 :], k + 2
    raise f.parse_error(
        "the frontmatter opened on line 1 is never closed by a '---' line",
        1,
        hint="Add a line with only '---' between the metadata and the prompt.",
    )


class _FrontmatterLoader(BoundedComposerMixin, yaml.SafeLoader):
    max_depth = MAX_FRONTMATTER_DEPTH
    max_nodes = MAX_FRONTMATTER_NODES


def _compose(fm: str, f: _File) -> tuple[yaml.Node | None, Any]:
    size = len(fm.encode("utf-8", errors="replace"))
    if size > MAX_FRONTMATTER_BYTES:
        raise f.parse_error(
            f"the frontmatter is {size} bytes, more than the limit of {MAX_FRONTMATTER_BYTES}",
            _FRONTMATTER_FIRST_LINE,
            hint="Keep the metadata small; long texts belong in the prompt.",
        )
    loader: _FrontmatterLoader | None = None
    try:
        # The reader refuses unprintable characters already here, so this is inside try.
        loader = _FrontmatterLoader(fm)
        node = loader.get_single_node()
        if node is not None:
            _check_duplicates(node, f)
            _check_uses_count(node, f)
        data = None if node is None else loader.construct_document(node)
    except YamlLimitError as e:
        raise f.parse_error(
            f"the frontmatter exceeds a limit: {e.message}",
            e.line + _FRONTMATTER_FIRST_LINE,
            e.column + 1,
            hint=f"The frontmatter may nest at most {MAX_FRONTMATTER_DEPTH} levels and hold "
            f"at most {MAX_FRONTMATTER_NODES} keys and values, an alias counting as what it names.",
        ) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = (mark.line if mark else 0) + _FRONTMATTER_FIRST_LINE
        column = (mark.column if mark else 0) + 1
        problem = e.problem or e.context or "invalid YAML"
        if e.problem and e.context:
            where = ""
            if e.context_mark is not None and e.context_mark is not mark:
                where = f" that starts on line {e.context_mark.line + _FRONTMATTER_FIRST_LINE}"
            problem = f"{e.problem} ({e.context}{where})"
        raise f.parse_error(
            f"invalid YAML in the frontmatter: {problem}",
            line,
            column,
            hint="Fix the YAML syntax at this position (indentation, a missing ':' or "
            "closing bracket, or a value with ': ' that needs quotes).",
        ) from None
    except yaml.YAMLError as e:
        raise f.parse_error(f"invalid YAML in the frontmatter: {e}", 2) from None
    finally:
        if loader is not None:
            loader.dispose()
    return node, data


def _check_uses_count(root: yaml.Node, f: _File) -> None:
    if not isinstance(root, yaml.MappingNode):
        return
    for k, v in root.value:
        if k.value == "uses" and isinstance(v, yaml.SequenceNode) and len(v.value) > MAX_USES:
            mark = v.value[MAX_USES].start_mark
            raise f.parse_error(
                f"uses has {len(v.value)} entries, more than the limit of {MAX_USES}",
                mark.line + _FRONTMATTER_FIRST_LINE,
                mark.column + 1,
                hint="Split the app: let a child app use some of the others.",
                key="uses",
            )


def _check_duplicates(node: yaml.Node, f: _File) -> None:
    # PyYAML keeps the last of two equal keys without a word; a silently dropped
    # 'output_schema' is worse than an error.
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                line = k.start_mark.line + _FRONTMATTER_FIRST_LINE
                if k.value in seen:
                    raise f.parse_error(
                        f"key {k.value!r} appears twice (first on line {seen[k.value]})",
                        line,
                        k.start_mark.column + 1,
                        hint="Keep one of the two entries.",
                        key=k.value,
                    )
                seen[k.value] = line
            _check_duplicates(v, f)
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            _check_duplicates(v, f)


def _non_json(value: Any, parts: list[str | int]) -> tuple[list[str | int], str] | None:
    """The first value YAML produced that JSON cannot carry (dates, sets, odd keys)."""
    if value is None or isinstance(value, bool | int | str):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (parts, "is not a finite number")
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = _non_json(v, [*parts, i])
            if found:
                return found
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return (
                    [*parts, str(k)],
                    f"key {k!r} is a YAML {json_type_of(k)}, not a string; quote it",
                )
            found = _non_json(v, [*parts, k])
            if found:
                return found
        return None
    return (parts, f"is a YAML {type(value).__name__} ({value!s}); quote it to make it a string")


# ---------------------------------------------------------------- frontmatter checks


def _check_frontmatter(data: Any, f: _File) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise f.meta_error(
            [],
            f"the frontmatter must be a mapping of keys to values, got {json_type_of(data)}",
            expected_schema=FRONTMATTER_SCHEMA,
            received=data,
        )
    bad = _non_json(data, [])
    if bad:
        raise f.meta_error(bad[0], bad[1], data=data)
    issues = validate_instance(FRONTMATTER_SCHEMA, data)
    if not issues:
        return data
    # An unknown key first: a misspelt required key is also reported missing, and the
    # spelling is the thing to fix.
    issues.sort(key=lambda i: not i.message.startswith(NOT_ALLOWED))
    first = issues[0]
    parts = _json_path_parts(first.path)
    message = first.message
    hint = None
    expected = _schema_at(FRONTMATTER_SCHEMA, parts)
    if message.startswith(NOT_ALLOWED):
        parent = _schema_at(FRONTMATTER_SCHEMA, parts[:-1])
        options = sorted(parent.get("properties", {}))
        message = f"unknown key{_suggest(str(parts[-1]), options)}"
        expected = parent
        if len(parts) == 1:
            hint = "Rename the key, or move custom fields under 'metadata', which is free-form."
    elif message == "required property is missing":
        message = "required key is missing"
    if parts == ["version"] and not isinstance(data.get("version"), str):
        hint = 'Quote the version so YAML keeps it a string: version: "1.0.0".'
    more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
    raise f.meta_error(
        parts,
        message + more,
        expected_schema=expected,
        data=data,
        hint=hint,
        issues=[i.model_dump() for i in issues],
    )


def _check_io_schemas(data: dict[str, Any], f: _File) -> None:
    """Compile Picoschema, then check both schemas; ``data`` keeps the JSON Schema."""
    for key in ("input_schema", "output_schema"):
        schema = data[key]
        problems: list[ValidationIssue] = []
        if not is_json_schema(schema):
            try:
                schema = data[key] = compile_picoschema(schema, where=key)
            except PicoschemaError as e:
                problems.append(e.issue)
        elif "$ref" in schema and "properties" not in schema:
            # pydantic exports a recursive model as a top-level $ref into $defs; its
            # properties are needed at the top (template variables, output fields).
            schema = data[key] = resolve_local(schema, schema)
        if not problems:
            problems = _top_level_problems(key, schema) + check_schema(schema, where=key)
        if problems:
            first = problems[0]
            parts = first.path.split(".")
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise f.meta_error(
                parts,
                first.message + more,
                expected_schema=SCHEMA_META_SCHEMA,
                data=data,
                hint=(
                    "Schemas are JSON Schema (Draft 2020-12, local $ref only) or Picoschema; "
                    "the top level is an object with properties (docs/rllm-spec.md)."
                ),
                issues=[p.model_dump() for p in problems],
            )


def _top_level_problems(key: str, schema: dict[str, Any]) -> list[ValidationIssue]:
    # Top-level properties are template variables and output fields, so they must be
    # written out at the top (not behind a $ref or a combinator).
    problems: list[ValidationIssue] = []
    if schema.get("type", "object") != "object":
        problems.append(_issue(f"{key}.type", "must be 'object' at the top level"))
    props = schema.get("properties")
    if not isinstance(props, dict):
        problems.append(_issue(f"{key}.properties", "is required at the top level"))
        return problems
    for name in props:
        if not _IDENT.match(name):
            problems.append(
                _issue(
                    f"{key}.properties.{name}",
                    "top-level property names must be identifiers (letters, digits, _)",
                )
            )
        elif name == RESERVED_ROOT:
            problems.append(_issue(f"{key}.properties.{name}", f"{RESERVED_ROOT!r} is reserved"))
    if key == "output_schema" and not props:
        problems.append(_issue(f"{key}.properties", "must declare at least one property"))
    return problems


def _issue(path: str, message: str) -> ValidationIssue:
    return ValidationIssue(path=path, message=message)


# ---------------------------------------------------------------- body sections


class _Section:
    def __init__(self, kind: str, header: str, line: int) -> None:
        self.kind = kind
        self.header = header
        self.line = line  # the header's line (the body's first line for the prompt)
        self.lines: list[str] = []

    def text(self) -> tuple[str, int]:
        """The section's text without surrounding blank lines, and its first file line."""
        lines = list(self.lines)
        first = self.line + (0 if self.kind == "prompt" else 1)
        while lines and not lines[0].strip():
            lines.pop(0)
            first += 1
        while lines and not lines[-1].strip():
            lines.pop()
        return "\n".join(lines).rstrip(), first


def _sections(body: list[str], first_line: int, f: _File) -> list[_Section]:
    current = _Section("prompt", "", first_line)
    out = [current]
    for i, line in enumerate(body):
        m = _SECTION.match(line)
        if m is None:
            current.lines.append(line)
            continue
        header = m.group(1)
        kind = header.split()[0]
        if kind not in ("recovery", "python"):
            raise f.parse_error(
                f"unknown section {kind!r}; sections are '=== recovery ===' and "
                "'=== python name=... stage=... outputs=... ==='",
                first_line + i,
                hint="Lines of the form '=== word ... ===' are reserved for sections.",
                section=kind,
            )
        current = _Section(kind, header, first_line + i)
        out.append(current)
    return out


def _python_block(sec: _Section, f: _File) -> PythonBlock:
    fields: dict[str, str] = {}
    for token in sec.header.split()[1:]:
        key, eq, value = token.partition("=")
        if not eq or key not in _BLOCK_KEYS:
            raise f.parse_error(
                f"python section: {token!r} is not one of "
                + ", ".join(f"{k}=..." for k in _BLOCK_KEYS),
                sec.line,
                hint="Write '=== python name=clean stage=pre inputs=text outputs=text ==='.",
            )
        if key in fields:
            raise f.parse_error(f"python section: {key} is given twice", sec.line)
        fields[key] = value
    for key in ("name", "stage", "outputs"):
        if not fields.get(key):
            raise f.parse_error(
                f"python section: {key}=... is required",
                sec.line,
                hint="Write '=== python name=clean stage=pre inputs=text outputs=text ==='.",
            )
    name = fields["name"]
    if not _IDENT.match(name):
        raise f.parse_error(f"python block name {name!r} is not an identifier", sec.line)
    if fields["stage"] not in ("pre", "post"):
        raise f.parse_error(
            f"python block {name!r}: stage must be 'pre' or 'post', not {fields['stage']!r}",
            sec.line,
        )
    names: dict[str, list[str]] = {}
    for key in ("inputs", "outputs"):
        names[key] = [n for n in fields.get(key, "").split(",") if n]
        for n in names[key]:
            if not _IDENT.match(n) or n.startswith("__"):
                raise f.parse_error(
                    f"python block {name!r}: {n!r} in {key} is not a usable variable name",
                    sec.line,
                )
        if len(set(names[key])) != len(names[key]):
            raise f.parse_error(f"python block {name!r}: a name is repeated in {key}", sec.line)
    code, first = sec.text()
    if not code.strip():
        raise f.parse_error(f"python block {name!r} has no code", sec.line)
    try:
        # Compiling only checks syntax; nothing runs here (blocks run in the sandbox).
        compile(code, f"{f.name}:{name}", "exec", dont_inherit=True)
    except SyntaxError as e:
        line = first + (e.lineno or 1) - 1
        raise f.parse_error(
            f"python block {name!r}: {e.msg}",
            line,
            e.offset or 1,
            hint="Fix the Python syntax; the block body is plain Python 3.11.",
            block=name,
        ) from None
    except (ValueError, RecursionError, MemoryError) as e:
        # Null bytes (ValueError) and expressions nested or chained past what CPython's
        # compiler can hold (RecursionError, MemoryError) are refused like a syntax error.
        raise f.parse_error(
            f"python block {name!r} cannot be compiled: {str(e) or type(e).__name__}",
            first,
            hint="Simplify the code: split long expressions and remove null bytes.",
            block=name,
        ) from None
    return PythonBlock(
        name=name,
        stage=fields["stage"],  # type: ignore[arg-type]
        inputs=names["inputs"],
        outputs=names["outputs"],
        code=code + "\n",
        line=sec.line,
    )


# ---------------------------------------------------------------- scopes and variables


class _Scope:
    """Names a template or map may read: inputs, pre-block outputs, child aliases."""

    def __init__(self, input_schema: dict[str, Any]) -> None:
        self.input_schema = input_schema
        self.inputs: dict[str, Any] = dict(input_schema.get("properties", {}))
        self.pre_outputs: set[str] = set()
        self.aliases: dict[str, list[str]] = {}

    def known(self) -> list[str]:
        return sorted({*self.inputs, *self.pre_outputs, *self.aliases})

    def problem(self, parts: Sequence[str]) -> str | None:
        """Why the reference ``parts`` cannot be resolved, or None when it can."""
        root = parts[0]
        if root in self.aliases:
            if len(parts) > 1 and parts[1] not in self.aliases[root]:
                return f"{root!r} exposes only {', '.join(self.aliases[root])}, not {parts[1]!r}"
            return None
        if root in self.pre_outputs:
            return None
        if root in self.inputs:
            return _subpath_problem(self.input_schema, self.inputs[root], list(parts))
        return f"unknown variable {root!r}{_suggest(root, self.known())}; known variables: " + (
            ", ".join(self.known()) or "none"
        )


def _subpath_problem(root: dict[str, Any], schema: Any, parts: list[str]) -> str | None:
    for i in range(1, len(parts)):
        here, part = ".".join(parts[:i]), parts[i]
        schema = resolve_local(root, schema)
        if not isinstance(schema, dict):
            return None
        types = schema.get("type")
        types = {types} if isinstance(types, str) else set(types or [])
        props = schema.get("properties")
        if isinstance(props, dict) and part in props:
            schema = props[part]
        elif "array" in types and part.isdigit():
            schema = schema.get("items", {})
        elif types and not types & {"object", "array"}:
            return f"{here!r} is a {'/'.join(sorted(types))}; it has no field {part!r}"
        elif schema.get("additionalProperties") is False:
            return f"{here!r} has no property {part!r}"
        else:
            return None  # an open object: any field may be present
    return None


def _check_refs(
    refs: list[TemplateRef], scope: _Scope, f: _File, *, where: str, recovery: bool
) -> None:
    for ref in refs:
        if ref.parts[0] == RESERVED_ROOT:
            if not recovery:
                problem = f"'{RESERVED_ROOT}.*' variables exist only in the recovery template"
            elif len(ref.parts) != 2 or ref.parts[1] not in RECOVERY_FIELDS:
                problem = f"'{RESERVED_ROOT}' has the fields " + ", ".join(RECOVERY_FIELDS)
            else:
                continue
        else:
            found = scope.problem(ref.parts)
            if found is None:
                continue
            problem = found
        raise f.parse_error(
            f"{where}: {{{{ {ref.name} }}}}: {problem}",
            ref.line,
            ref.column,
            hint="Use only variables declared in input_schema.properties, outputs of pre "
            "blocks, or alias.field of a uses entry.",
            variable=ref.name,
            known_variables=scope.known(),
        )


def _check_scopes(
    data: dict[str, Any],
    blocks: list[PythonBlock],
    f: _File,
) -> _Scope:
    scope = _Scope(data["input_schema"])
    out_props = set(data["output_schema"].get("properties", {}))
    names: set[str] = set()
    for b in blocks:
        if b.name in names:
            raise f.parse_error(f"python block name {b.name!r} is used twice", b.line)
        names.add(b.name)
    aliases = [u["alias"] for u in data.get("uses", [])]
    for b in blocks:
        if b.stage == "pre":
            readable = set(scope.inputs) | scope.pre_outputs
            for n in b.inputs:
                if n not in readable:
                    raise f.parse_error(
                        f"pre block {b.name!r} reads {n!r}, which is neither an input "
                        "property nor an output of an earlier pre block",
                        b.line,
                        block=b.name,
                        variable=n,
                    )
            for n in b.outputs:
                if n in aliases or n == RESERVED_ROOT:
                    raise f.parse_error(
                        f"pre block {b.name!r} output {n!r} clashes with a reserved name or "
                        "a uses alias",
                        b.line,
                        block=b.name,
                    )
            scope.pre_outputs |= set(b.outputs)
    for b in blocks:
        if b.stage == "post":
            readable = out_props | set(scope.inputs) | scope.pre_outputs
            for n in b.inputs:
                if n not in readable:
                    raise f.parse_error(
                        f"post block {b.name!r} reads {n!r}, which is not an output "
                        "property, an input property or a pre-block output",
                        b.line,
                        block=b.name,
                        variable=n,
                    )
            for n in b.outputs:
                if n not in out_props:
                    raise f.parse_error(
                        f"post block {b.name!r} writes {n!r}, which is not a property of "
                        "output_schema",
                        b.line,
                        block=b.name,
                        variable=n,
                    )
    for i, use in enumerate(data.get("uses", [])):
        alias = use["alias"]
        if alias in scope.aliases or alias in scope.inputs or alias in scope.pre_outputs:
            raise f.meta_error(
                ["uses", i, "alias"],
                f"alias {alias!r} is already an input, a pre-block output or another alias",
                data=data,
            )
        if alias == RESERVED_ROOT:
            raise f.meta_error(["uses", i, "alias"], f"{RESERVED_ROOT!r} is reserved", data=data)
        for child_input, ref in sorted(use.get("input_map", {}).items()):
            problem = scope.problem(ref.split("."))
            if problem is not None:
                raise f.meta_error(
                    ["uses", i, "input_map", child_input],
                    f"{ref!r}: {problem}",
                    data=data,
                    hint="Map child inputs to parent inputs, pre-block outputs, or fields "
                    "exposed by an earlier uses entry.",
                )
        # Added after its own input_map is checked: an entry may only read earlier entries.
        scope.aliases[alias] = list(use["exposes"])
    for out_name, ref in sorted(data.get("output_map", {}).items()):
        if out_name not in out_props:
            raise f.meta_error(
                ["output_map", out_name],
                f"{out_name!r} is not a property of output_schema",
                data=data,
            )
        alias, field = ref.split(".")
        if alias not in scope.aliases:
            raise f.meta_error(
                ["output_map", out_name],
                f"{ref!r}: {alias!r} is not a uses alias{_suggest(alias, list(scope.aliases))}",
                data=data,
            )
        if field not in scope.aliases[alias]:
            raise f.meta_error(
                ["output_map", out_name],
                f"{ref!r}: {alias!r} exposes only {', '.join(scope.aliases[alias])}",
                data=data,
            )
    return scope


# ---------------------------------------------------------------- entry points


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


def _parse(text: str, path: str | None, digest: str) -> RllmProgram:
    f = _File(path)
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    fm, body, body_line = _split(text, f)
    f.root, data = _compose(fm, f)
    data = _check_frontmatter(data, f)
    _check_io_schemas(data, f)
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

    sections = _sections(body, body_line, f)
    prompt_sec = sections[0]
    recovery: tuple[str, int] | None = None
    blocks: list[PythonBlock] = []
    for sec in sections[1:]:
        if sec.kind == "recovery":
            if recovery is not None:
                raise f.parse_error("a second '=== recovery ===' section", sec.line)
            recovery = sec.text()
        else:
            blocks.append(_python_block(sec, f))
    scope = _check_scopes(data, blocks, f)

    prompt, prompt_line = prompt_sec.text()
    program_uses = [UseSpec.model_validate(u) for u in data.get("uses", [])]
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
        _check_refs(
            template_refs(prompt, first_line=prompt_line),
            scope,
            f,
            where="prompt",
            recovery=False,
        )
        if recovery is not None:
            _check_refs(
                template_refs(recovery[0], first_line=recovery[1]),
                scope,
                f,
                where="recovery",
                recovery=True,
            )
    except TemplateSyntaxError as e:
        raise f.parse_error(
            e.message,
            e.line,
            e.column,
            hint="Templates only know {{ name }} and {{ name.field }}; write \\{{ for '{{'.",
        ) from None

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
