"""Typed I/O of a running app: input checks, the variables a template sees, output merging.

These are the pure steps the ``RllmApp`` workflow strings together around its
activities (docs/rllm-spec.md, "Execution"):

1. :func:`coerce_input` then :func:`validate_input` (defaults filled in);
2. pre blocks run; their outputs join the variables;
3. for each ``uses`` entry, :func:`child_input` builds the child's input and the child
   runs; its output, cut to ``exposes`` by :func:`exposed_output`, joins the variables;
4. :func:`template_variables` + :func:`render_prompt`, the model call, and
   :func:`keel.rllm.output.check_output` against ``program.llm_output_schema()``;
5. :func:`merge_output` adds the ``output_map`` fields; post blocks run,
   :func:`apply_block_outputs` takes their results, and
   :func:`keel.rllm.output.validate_output` checks the final value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from keel.rllm.errors import InputSchemaError, PythonBlockExecutionError
from keel.rllm.model import PythonBlock, RllmProgram, UseSpec
from keel.rllm.output import validate_output
from keel.rllm.render import MISSING, lookup, render
from keel.rllm.schema import apply_defaults, json_type_of, validate_instance


def coerce_input(program: RllmProgram, value: Any) -> Any:
    """Accept a bare string for an app with exactly one required string input.

    ``runllm run summary.rllm --input "some text"`` then means ``{"text": "some text"}``.
    Nothing else is coerced (no ``"5"`` to ``5``): a silent conversion would hide a
    wrong input from the schema check.
    """
    if not isinstance(value, str):
        return value
    props = program.input_schema.get("properties", {})
    required = program.input_schema.get("required", [])
    if len(required) == 1 and props.get(required[0], {}).get("type") == "string":
        return {required[0]: value}
    return value


def validate_input(program: RllmProgram, value: Any) -> dict[str, Any]:
    """The input with schema defaults filled in, when it matches ``input_schema``.

    Raises:
        InputSchemaError: every issue in ``details.issues``; ``expected_schema`` is the
            app's input schema and ``received_payload`` the input as given.
    """
    if not isinstance(value, dict):
        issues_list = [{"path": "$", "message": f"expected object, got {json_type_of(value)}"}]
        raise InputSchemaError(
            f"input of {program.name!r} must be a JSON object, got {json_type_of(value)}",
            details={"app": program.name, "issues": issues_list},
            expected_schema=program.input_schema,
            received_payload=value,
        )
    filled = apply_defaults(program.input_schema, value)
    issues = validate_instance(program.input_schema, filled)
    if issues:
        more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
        raise InputSchemaError(
            f"input of {program.name!r} does not match input_schema: {issues[0].line()}{more}",
            details={"app": program.name, "issues": [i.model_dump() for i in issues]},
            expected_schema=program.input_schema,
            received_payload=value,
        )
    return dict(filled)


def exposed_output(use: UseSpec, child_output: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a child's output its parent may read: the ``exposes`` fields."""
    return {k: child_output[k] for k in use.exposes if k in child_output}


def child_input(use: UseSpec, variables: Mapping[str, Any]) -> dict[str, Any]:
    """The input for the child of ``use``, read through its ``input_map``.

    A reference to an optional parent input that was not given is left out, so the
    child's own default (or its schema check) decides.
    """
    out: dict[str, Any] = {}
    for name, ref in sorted(use.input_map.items()):
        value = lookup(variables, ref.split("."))
        if value is not MISSING:
            out[name] = value
    return out


def template_variables(
    program: RllmProgram,
    inputs: Mapping[str, Any],
    *,
    pre_outputs: Mapping[str, Any] | None = None,
    child_outputs: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The variables templates see: inputs, then pre-block outputs, then child aliases.

    ``child_outputs`` maps each alias to its child's whole output; only the exposed
    fields are kept. Pre-block outputs shadow inputs of the same name on purpose (a
    block may clean an input in place, e.g. ``outputs=text``).
    """
    scope: dict[str, Any] = dict(inputs)
    scope.update(pre_outputs or {})
    for use in program.uses:
        if child_outputs is not None and use.alias in child_outputs:
            scope[use.alias] = exposed_output(use, child_outputs[use.alias])
    return scope


def render_prompt(program: RllmProgram, variables: Mapping[str, Any]) -> str:
    """The app's prompt, rendered (empty for a pure composition)."""
    return render(program.prompt_template, variables)


def block_inputs(block: PythonBlock, variables: Mapping[str, Any]) -> dict[str, Any]:
    """The values a Python block declared as inputs; absent optional values are left out."""
    return {n: variables[n] for n in block.inputs if n in variables}


def apply_block_outputs(
    block: PythonBlock, target: Mapping[str, Any], produced: Mapping[str, Any]
) -> dict[str, Any]:
    """``target`` updated with a block's declared outputs.

    Raises:
        PythonBlockExecutionError: a declared output is missing from ``produced`` (the
            sandbox already refuses that; this guards other runners).
    """
    missing = [n for n in block.outputs if n not in produced]
    if missing:
        raise PythonBlockExecutionError(
            f"python block {block.name!r} did not set {', '.join(missing)}",
            details={"block": block.name, "stage": block.stage, "missing": missing},
            received_payload=dict(produced),
        )
    out = dict(target)
    out.update({n: produced[n] for n in block.outputs})
    return out


def block_failed(
    block: PythonBlock,
    error_type: str,
    message: str,
    *,
    traceback: str = "",
    inputs: Mapping[str, Any] | None = None,
) -> PythonBlockExecutionError:
    """The error for a block the sandbox reported as failed (its ``PythonBlockError``).

    ``inputs`` become the ``received_payload`` so the failure can be replayed by hand;
    the traceback is cut to its last 4000 characters to keep payloads small.
    """
    return PythonBlockExecutionError(
        f"python block {block.name!r} ({block.stage}) failed: {error_type}: {message}",
        details={
            "block": block.name,
            "stage": block.stage,
            "line": block.line,
            "type": error_type,
            "message": message,
            "traceback": traceback[-4000:],
        },
        received_payload=dict(inputs or {}),
    )


def merge_output(
    program: RllmProgram,
    llm_output: Mapping[str, Any] | None,
    child_outputs: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The app's output: the model's fields plus those ``output_map`` takes from children.

    ``llm_output`` is ``None`` for a pure composition (``program.needs_llm`` is False).
    The result is validated against the whole ``output_schema``.

    Raises:
        OutputSchemaError: the merged value does not match ``output_schema`` (e.g. a
            child's field is absent because it was not in its output).
    """
    merged: dict[str, Any] = dict(llm_output or {})
    children = child_outputs or {}
    for name, ref in sorted(program.output_map.items()):
        alias, field = ref.split(".")
        child = children.get(alias, {})
        if field in child:
            merged[name] = child[field]
    return validate_output(merged, program.output_schema)
