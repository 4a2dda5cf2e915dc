"""Parsing a ``.rllm`` file: splitting it, composing the YAML frontmatter under limits and
checking it against the frontmatter schema and the I/O schemas."""

from __future__ import annotations

import math
from typing import Any

import yaml

from keel.rllm.model import (
    FRONTMATTER_SCHEMA,
)
from keel.rllm.parse_file import (
    _FRONTMATTER_FIRST_LINE,
    _IDENT,
    MAX_FRONTMATTER_BYTES,
    MAX_FRONTMATTER_DEPTH,
    MAX_FRONTMATTER_NODES,
    MAX_USES,
    _File,
    _json_path_parts,
    _schema_at,
    _suggest,
)
from keel.rllm.picoschema import PicoschemaError, compile_picoschema, is_json_schema
from keel.rllm.render import (
    RESERVED_ROOT,
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
