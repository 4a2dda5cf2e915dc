"""How ``runllm`` reads an app's input from the command line (``--input``,
``--input-file``) and checks it against the app's ``input_schema``. Neither Temporal nor
LiteLLM is imported."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keel.rllm.failures import usage_failure

if TYPE_CHECKING:
    from keel.rllm.model import RllmProgram


def _parse_text_input(program: RllmProgram, text: str) -> Any:
    """JSON, a YAML mapping of the app's inputs, or else the text itself."""
    import yaml

    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            return json.loads(stripped)
        except ValueError:
            pass
        try:
            return yaml.safe_load(stripped)
        except yaml.YAMLError:
            return text
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    props = program.input_schema.get("properties", {})
    # "Note: read this" is YAML for {"Note": "read this"}: only a mapping of the app's
    # own input names is taken as structured input, anything else is text.
    if isinstance(value, dict) and value and all(k in props for k in value):
        return value
    return text


def read_input(program: RllmProgram, text: str | None, file: Path | None) -> Any:
    """The input as given on the command line (before defaults and the schema check)."""
    import yaml

    if text is not None and file is not None:
        raise usage_failure("give the input with --input or --input-file, not both")
    if file is not None:
        try:
            raw = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise usage_failure(
                f"cannot read the input file {file}: {getattr(e, 'strerror', None) or e}",
                details={"input_file": str(file)},
            ) from None
        suffix = file.suffix.lower()
        try:
            if suffix == ".json":
                return json.loads(raw)
            if suffix in (".yaml", ".yml"):
                return yaml.safe_load(raw)
        except (ValueError, yaml.YAMLError) as e:
            raise usage_failure(
                f"the input file {file} is not valid {suffix[1:].upper()}: {e}",
                details={"input_file": str(file)},
            ) from None
        return _parse_text_input(program, raw)
    if text is None:
        return {}
    return _parse_text_input(program, text)


def checked_input(program: RllmProgram, value: Any) -> dict[str, Any]:
    """The input coerced and checked against ``input_schema`` (defaults filled in)."""
    from keel.rllm.contracts import coerce_input, validate_input

    return validate_input(program, coerce_input(program, value))
