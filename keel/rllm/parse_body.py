"""Parsing a ``.rllm`` file: the body's sections, its Python blocks, and the variables each
template and block may use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keel.rllm.model import (
    PythonBlock,
)
from keel.rllm.parse_file import _BLOCK_KEYS, _IDENT, _SECTION, _File, _suggest
from keel.rllm.render import (
    RECOVERY_FIELDS,
    RESERVED_ROOT,
    TemplateRef,
)
from keel.rllm.schema import (
    resolve_local,
)


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


_BLOCK_HINT = "Write '=== python name=clean stage=pre inputs=text outputs=text ==='."


def _block_fields(sec: _Section, f: _File) -> dict[str, str]:
    """The ``key=value`` fields of a python section's header, each known key once and
    ``name``, ``stage`` and ``outputs`` present."""
    fields: dict[str, str] = {}
    for token in sec.header.split()[1:]:
        key, eq, value = token.partition("=")
        if not eq or key not in _BLOCK_KEYS:
            raise f.parse_error(
                f"python section: {token!r} is not one of "
                + ", ".join(f"{k}=..." for k in _BLOCK_KEYS),
                sec.line,
                hint=_BLOCK_HINT,
            )
        if key in fields:
            raise f.parse_error(f"python section: {key} is given twice", sec.line)
        fields[key] = value
    for key in ("name", "stage", "outputs"):
        if not fields.get(key):
            raise f.parse_error(
                f"python section: {key}=... is required", sec.line, hint=_BLOCK_HINT
            )
    return fields


def _block_names(
    name: str, fields: dict[str, str], sec: _Section, f: _File
) -> dict[str, list[str]]:
    """The block's ``inputs`` and ``outputs`` lists, each a usable name, none repeated."""
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
    return names


def _compile_block(code: str, first: int, name: str, f: _File) -> None:
    """Refuse a block whose code does not compile (syntax only: nothing runs here; blocks
    run in the sandbox)."""
    try:
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


def _python_block(sec: _Section, f: _File) -> PythonBlock:
    fields = _block_fields(sec, f)
    name = fields["name"]
    if not _IDENT.match(name):
        raise f.parse_error(f"python block name {name!r} is not an identifier", sec.line)
    if fields["stage"] not in ("pre", "post"):
        raise f.parse_error(
            f"python block {name!r}: stage must be 'pre' or 'post', not {fields['stage']!r}",
            sec.line,
        )
    names = _block_names(name, fields, sec, f)
    code, first = sec.text()
    if not code.strip():
        raise f.parse_error(f"python block {name!r} has no code", sec.line)
    _compile_block(code, first, name, f)
    return PythonBlock(
        name=name,
        stage=fields["stage"],  # type: ignore[arg-type]
        inputs=names["inputs"],
        outputs=names["outputs"],
        code=code + "\n",
        line=sec.line,
    )


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


def _check_reads(b: PythonBlock, readable: set[str], what: str, f: _File) -> None:
    """Refuse a block input not in ``readable`` (``what`` says what it should be)."""
    for n in b.inputs:
        if n not in readable:
            raise f.parse_error(
                f"{b.stage} block {b.name!r} reads {n!r}, {what}",
                b.line,
                block=b.name,
                variable=n,
            )


def _check_blocks(
    scope: _Scope, blocks: list[PythonBlock], data: dict[str, Any], out_props: set[str], f: _File
) -> None:
    """Block names are unique; pre blocks read inputs and earlier pre outputs (which then
    join ``scope``); post blocks read those or output properties and write output
    properties."""
    names: set[str] = set()
    for b in blocks:
        if b.name in names:
            raise f.parse_error(f"python block name {b.name!r} is used twice", b.line)
        names.add(b.name)
    aliases = [u["alias"] for u in data.get("uses", [])]
    for b in blocks:
        if b.stage == "pre":
            readable = set(scope.inputs) | scope.pre_outputs
            what = "which is neither an input property nor an output of an earlier pre block"
            _check_reads(b, readable, what, f)
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
            what = "which is not an output property, an input property or a pre-block output"
            _check_reads(b, readable, what, f)
            for n in b.outputs:
                if n not in out_props:
                    raise f.parse_error(
                        f"post block {b.name!r} writes {n!r}, which is not a property of "
                        "output_schema",
                        b.line,
                        block=b.name,
                        variable=n,
                    )


def _add_uses(scope: _Scope, data: dict[str, Any], f: _File) -> None:
    """Each ``uses`` entry's alias joins ``scope`` once its ``input_map`` reads only what
    is in scope before it."""
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


def _check_output_map(scope: _Scope, data: dict[str, Any], out_props: set[str], f: _File) -> None:
    """Each ``output_map`` entry fills an output property from a field a uses alias
    exposes."""
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


def _check_scopes(
    data: dict[str, Any],
    blocks: list[PythonBlock],
    f: _File,
) -> _Scope:
    scope = _Scope(data["input_schema"])
    out_props = set(data["output_schema"].get("properties", {}))
    _check_blocks(scope, blocks, data, out_props, f)
    _add_uses(scope, data, f)
    _check_output_map(scope, data, out_props, f)
    return scope
