"""``.rllm`` apps: single-shot LLM programs with typed input and output (format v0.1).

Pure domain code for the ``RllmApp`` workflow and the ``runllm`` CLI: parsing and
validation (:mod:`~keel.rllm.parser`), the models (:mod:`~keel.rllm.model`), JSON Schema
checks (:mod:`~keel.rllm.schema`) and Picoschema (:mod:`~keel.rllm.picoschema`), templates
and recovery prompts (:mod:`~keel.rllm.render`), token estimates (:mod:`~keel.rllm.estimate`), typed I/O
(:mod:`~keel.rllm.contracts`, :mod:`~keel.rllm.output`), composition
(:mod:`~keel.rllm.deps`) and the error payloads (:mod:`~keel.rllm.errors`).
The format is specified in docs/rllm-spec.md, the errors in docs/rllm-errors.md.
"""

from keel.rllm.contracts import (
    apply_block_outputs,
    block_failed,
    block_inputs,
    child_input,
    coerce_input,
    exposed_output,
    merge_output,
    render_prompt,
    template_variables,
    validate_input,
)
from keel.rllm.deps import (
    DependencyEdge,
    DependencyGraph,
    DependencyNode,
    ResolvedApp,
    resolve,
)
from keel.rllm.errors import (
    EXIT_CODES,
    ContextWindowExceededError,
    DependencyResolutionError,
    InputSchemaError,
    LLMParamValidationError,
    MetadataValidationError,
    OllamaModelMissingError,
    OutputSchemaError,
    ParseError,
    PythonBlockExecutionError,
    RetryExhaustedError,
    RllmError,
    RllmErrorPayload,
    error_from_payload,
    ollama_model_missing,
)
from keel.rllm.estimate import check_context_window, estimate_prompt_tokens, estimate_tokens
from keel.rllm.model import LLMSpec, PythonBlock, RllmProgram, UseSpec
from keel.rllm.output import (
    OutputCheck,
    check_output,
    parse_output,
    retry_exhausted,
    validate_output,
)
from keel.rllm.parser import parse_bytes, parse_text
from keel.rllm.render import DEFAULT_RECOVERY_TEMPLATE, render, render_recovery
from keel.rllm.schema import ValidationIssue, check_schema, validate_instance

__all__ = [
    "DEFAULT_RECOVERY_TEMPLATE",
    "EXIT_CODES",
    "ContextWindowExceededError",
    "DependencyEdge",
    "DependencyGraph",
    "DependencyNode",
    "DependencyResolutionError",
    "InputSchemaError",
    "LLMParamValidationError",
    "LLMSpec",
    "MetadataValidationError",
    "OllamaModelMissingError",
    "OutputCheck",
    "OutputSchemaError",
    "ParseError",
    "PythonBlock",
    "PythonBlockExecutionError",
    "ResolvedApp",
    "RetryExhaustedError",
    "RllmError",
    "RllmErrorPayload",
    "RllmProgram",
    "UseSpec",
    "ValidationIssue",
    "apply_block_outputs",
    "block_failed",
    "block_inputs",
    "check_context_window",
    "check_output",
    "check_schema",
    "child_input",
    "coerce_input",
    "error_from_payload",
    "estimate_prompt_tokens",
    "estimate_tokens",
    "exposed_output",
    "merge_output",
    "ollama_model_missing",
    "parse_bytes",
    "parse_output",
    "parse_text",
    "render",
    "render_prompt",
    "render_recovery",
    "resolve",
    "retry_exhausted",
    "template_variables",
    "validate_input",
    "validate_instance",
    "validate_output",
]
