"""Pydantic models of a parsed ``.rllm`` app, and the JSON Schema of its frontmatter.

:class:`RllmProgram` is what :func:`keel.rllm.parser.load` returns and what the
``RllmApp`` workflow receives; it is plain data (JSON round-trips exactly), so it can
travel in Temporal payloads. The file itself is validated against
:data:`FRONTMATTER_SCHEMA` by the parser, which gives errors with keys and line numbers;
these models only give the validated data its types.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from keel.rllm.params import answer_tokens

FORMAT_VERSION = "0.1"
SUPPORTED_FORMAT_VERSIONS = ("0.1",)

IDENT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# App names end up in workflow ids (rllm/<name>/<input digest>) and file names.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
SEMVER_PATTERN = (
    r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$"
)
PROVIDER_PATTERN = r"^[a-z0-9_][a-z0-9_.-]*$"
MODEL_STRING_PATTERN = r"^[a-z0-9_][a-z0-9_.-]*/\S+$"
REF_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.([A-Za-z_][A-Za-z0-9_]*|[0-9]+))*$"
OUTPUT_REF_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$"

#: ``llm.provider`` value meaning "``llm.model`` is a name from configs/models.yaml".
KEEL_PROVIDER = "keel"

REQUIRED_KEYS = (
    "name",
    "description",
    "version",
    "author",
    "max_context_window",
    "input_schema",
    "output_schema",
    "llm",
    "llm_params",
)

_IDENT_LIST: dict[str, Any] = {
    "type": "array",
    "items": {"type": "string", "pattern": IDENT_PATTERN},
    "uniqueItems": True,
}

LLM_SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["provider", "model"],
    "properties": {
        "provider": {"type": "string", "pattern": PROVIDER_PATTERN},
        "model": {"type": "string", "minLength": 1},
    },
}

USE_SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["path", "alias", "exposes"],
    "properties": {
        "path": {"type": "string", "pattern": r"\.rllm$"},
        "alias": {"type": "string", "pattern": IDENT_PATTERN},
        "exposes": {**_IDENT_LIST, "minItems": 1},
        "input_map": {
            "type": "object",
            "propertyNames": {"pattern": IDENT_PATTERN},
            "additionalProperties": {"type": "string", "pattern": REF_PATTERN},
        },
    },
}

#: JSON Schema of the frontmatter (full JSON Schema: this is Keel's schema, not an app's).
FRONTMATTER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": list(REQUIRED_KEYS),
    "properties": {
        "format_version": {"type": "string", "enum": list(SUPPORTED_FORMAT_VERSIONS)},
        "name": {"type": "string", "pattern": NAME_PATTERN},
        "description": {"type": "string", "minLength": 1},
        "version": {"type": "string", "pattern": SEMVER_PATTERN},
        "author": {"type": "string", "minLength": 1},
        "max_context_window": {"type": "integer", "minimum": 1},
        "input_schema": {"type": "object"},
        "output_schema": {"type": "object"},
        "llm": LLM_SPEC_SCHEMA,
        "llm_params": {"type": "object"},
        "metadata": {"type": "object"},
        "recommended_models": {
            "type": "array",
            "items": {"type": "string", "pattern": MODEL_STRING_PATTERN},
            "uniqueItems": True,
        },
        "tags": {"type": "array", "items": {"type": "string", "minLength": 1}, "uniqueItems": True},
        "uses": {"type": "array", "items": USE_SPEC_SCHEMA},
        "output_map": {
            "type": "object",
            "propertyNames": {"pattern": IDENT_PATTERN},
            "additionalProperties": {"type": "string", "pattern": OUTPUT_REF_PATTERN},
        },
        "output_format": {"type": "string", "enum": ["json"]},
        "structured_output": {"type": "boolean"},
    },
}


class LLMSpec(BaseModel):
    """The model an app runs on: a LiteLLM provider and model (any model LiteLLM can call;
    no models-config entry needed), or a Keel model name (``provider: keel``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: str = Field(pattern=PROVIDER_PATTERN)
    model: str = Field(min_length=1)

    @property
    def is_config_name(self) -> bool:
        """Whether ``model`` names an entry of configs/models.yaml (``provider: keel``)."""
        return self.provider == KEEL_PROVIDER

    @property
    def litellm_model(self) -> str:
        """LiteLLM's ``provider/model`` string (meaningless for ``provider: keel``)."""
        return f"{self.provider}/{self.model}"

    @classmethod
    def from_string(cls, value: str) -> LLMSpec:
        """Parse ``provider/model`` (split at the first ``/``: ``hosted_vllm/Qwen/Q2``)."""
        provider, sep, model = value.partition("/")
        if not sep:
            raise ValueError(f"{value!r} is not of the form provider/model")
        return cls(provider=provider, model=model)


class UseSpec(BaseModel):
    """One ``uses`` entry: a child app, the alias its outputs appear under, its contract.

    ``exposes`` lists the child's output properties the parent may read, as
    ``{{ alias.field }}`` in templates and ``alias.field`` in maps. ``input_map`` maps
    each child input name to a reference in the parent's scope: a parent input
    (``text``, ``doc.title``), a pre-block output, or an earlier alias's exposed field.
    """

    model_config = ConfigDict(extra="forbid")

    path: str
    alias: str = Field(pattern=IDENT_PATTERN)
    exposes: list[str] = Field(min_length=1)
    input_map: dict[str, str] = Field(default_factory=dict)


class PythonBlock(BaseModel):
    """A named Python block run in the sandbox before rendering (pre) or after output (post).

    The block sees ``inputs`` as variables and must assign every name in ``outputs``
    (JSON values). ``line`` is the file line of its ``=== python ... ===`` header.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=IDENT_PATTERN)
    stage: Literal["pre", "post"]
    inputs: list[str] = Field(default_factory=list)
    outputs: list[str] = Field(min_length=1)
    code: str
    line: int = 0


class RllmProgram(BaseModel):
    """A parsed, validated ``.rllm`` app (format v0.1)."""

    model_config = ConfigDict(extra="forbid")

    format_version: str = FORMAT_VERSION
    name: str
    description: str
    version: str
    author: str
    max_context_window: int
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    llm: LLMSpec
    llm_params: dict[str, Any]
    metadata: dict[str, Any] = Field(default_factory=dict)
    recommended_models: list[LLMSpec] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    uses: list[UseSpec] = Field(default_factory=list)
    output_map: dict[str, str] = Field(default_factory=dict)
    output_format: Literal["json"] = "json"
    #: Ask the model's server to decode against ``output_schema`` where it can
    #: (``configs/models.yaml`` ``structured_output``); ``false`` in the frontmatter opts
    #: out. The schema check and recovery prompt run either way.
    structured_output: bool = True
    prompt_template: str
    recovery_template: str | None = None
    python_blocks: list[PythonBlock] = Field(default_factory=list)
    source_path: str | None = None
    source_digest: str

    @property
    def pre_blocks(self) -> list[PythonBlock]:
        """The ``pre`` blocks, in file order (the order they run in)."""
        return [b for b in self.python_blocks if b.stage == "pre"]

    @property
    def post_blocks(self) -> list[PythonBlock]:
        """The ``post`` blocks, in file order (the order they run in)."""
        return [b for b in self.python_blocks if b.stage == "post"]

    @property
    def max_tokens(self) -> int:
        """The answer length reserved by ``llm_params`` (``max_tokens`` or its alias)."""
        return answer_tokens(self.llm_params)

    @property
    def llm_output_properties(self) -> list[str]:
        """Output properties the model must produce: those ``output_map`` does not fill."""
        return [p for p in self.output_schema.get("properties", {}) if p not in self.output_map]

    @property
    def needs_llm(self) -> bool:
        """False for a pure composition, whose whole output comes from ``output_map``."""
        return bool(self.llm_output_properties)

    def llm_output_schema(self) -> dict[str, Any]:
        """The part of ``output_schema`` the model answers: without ``output_map`` fields.

        Equal to ``output_schema`` for an app with no ``output_map``. This is the schema
        the model's JSON is validated against and the one quoted in recovery prompts.
        """
        if not self.output_map:
            return self.output_schema
        keep = self.llm_output_properties
        schema = {
            k: v for k, v in self.output_schema.items() if k not in ("properties", "required")
        }
        props = self.output_schema.get("properties", {})
        schema["properties"] = {k: props[k] for k in keep}
        required = [r for r in self.output_schema.get("required", []) if r in keep]
        if required:
            schema["required"] = required
        return schema

    def ollama_models(self) -> list[str]:
        """Model names of the ``ollama/...`` entries of ``recommended_models``."""
        return [m.model for m in self.recommended_models if m.provider == "ollama"]
