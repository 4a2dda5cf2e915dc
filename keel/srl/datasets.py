"""Dataset records of the SRL family: the normalised record, ``_meta.json``, the manifest,
per-dataset mappers and the processing helpers (dedup, token filter, split, stats).

All pure: a loader activity reads the published files, checks them with
:func:`check_manifest`, feeds their lines to :func:`normalise_lines` and writes what comes
back. A malformed record is returned as a :class:`MalformedRecord` with its 1-based line,
never dropped silently.

Published layouts, and where each was read (docs/srl-data.md keeps the list, and
``configs/srl/datasets.yaml`` says per dataset whether it is confirmed):

* CommitPackFT (``bigcode/commitpackft``, card "Data Fields"): ``commit``, ``old_file``,
  ``new_file``, ``old_contents``, ``new_contents``, ``subject``, ``message``, ``lang``,
  ``license``, ``repos``; JSONL per language.
* EditPackFT (``nuprl/EditPackFT``, card ``dataset_info.features``; the code that builds
  it, ``editpackft/filter.py`` and ``format.py`` in ``nuprl/CanItEdit``): the
  CommitPackFT fields plus ``ndiff``, ``instruction``, ``content``; parquet.
* OCEDataFT (``zkzhang88/OpenCodeEdit`` ``datasets/ocedataft.jsonl``, also the Hub's
  ``zkzhang88/OCEData``): read from the code that writes it, the repository's
  ``generation/generate_finetune_dataset.py`` (its README: "JSONL files in ShareGPT
  format"): ``old_code``, ``new_code``, ``commit``, ``instr_type`` and the prompt, either
  ShareGPT ``messages`` (the default) or Alpaca ``instruction``, whose ``## Instruction:``
  section is the instruction. The unfiltered ``ocedata.jsonl`` triplets use
  ``instruct_purify``, ``code_before_purify``, ``code_after_purify``.

Not confirmed:

* AgentPack (``nuprl/AgentPack``): gated; its card's field list could not be read. What
  public material shows (a loader that reads it with ``datasets``, a listing of its
  files): ``train/`` holds ``.jsonl.gz`` shards whose rows are commits, ``event_id``,
  ``agent``, ``repo``, ``sha``, a description, and ``patch``, a unified diff; no file
  contents. :func:`map_agentpack` keeps a row whose patch changes one existing file in one
  hunk, and makes the hunk's two sides the pre- and post-text (tagged ``fragment``: a
  region of the file, not the whole file).
* MaRV and SmellyCode: no published location or schema was found. Their mappers take the
  first present of several candidate field names (:data:`CANDIDATE_FIELDS`); the error of
  a record that has none of the candidates names every candidate it tried.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Literal, NamedTuple

import blake3
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

from keel.digest import canonical_json
from keel.srl.errors import MalformedRecord, ManifestMismatch

TokenCounter = Callable[[str], int]
Split = Literal["train", "dev", "test"]
DEFAULT_MAX_TOKENS = 2048

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
# SPDX license expression: ids (or LicenseRef-…) joined by AND / OR / WITH.
_SPDX_ID = r"(?:LicenseRef-[A-Za-z0-9.-]+|[A-Za-z0-9][A-Za-z0-9.+-]*)"
Spdx = Annotated[
    str, StringConstraints(pattern=rf"^\(?{_SPDX_ID}(?: (?:AND|OR|WITH) {_SPDX_ID})*\)?$")
]

EXTENSIONS: dict[str, str] = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "typescript",
    ".java": "java",
}
# Split folders follow the plan's data/processed/{python,javascript,java}; TS goes with JS.
LANGUAGE_GROUPS: dict[str, str] = {
    "python": "python",
    "javascript": "javascript",
    "typescript": "javascript",
    "java": "java",
}


class NormalizedRecord(BaseModel):
    """``{instruction, pre, post, language, tags, file}``: one edit task, whatever its
    source. ``tags[0]`` is the dataset; ``file`` is the published path where the dataset
    names one (``None`` where it does not, and in records written before it existed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instruction: Annotated[str, StringConstraints(min_length=1)]
    pre: str
    post: str
    language: Annotated[str, StringConstraints(pattern=r"^[a-z0-9#+._-]+$")]
    tags: list[str] = Field(default_factory=list)
    file: str | None = None


class DatasetMeta(BaseModel):
    """``_meta.json`` of one ingested dataset (plan §3.1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Annotated[str, StringConstraints(min_length=1)]
    version: Annotated[str, StringConstraints(min_length=1)]
    license: Spdx
    downloaded_at: AwareDatetime
    sha256: Sha256
    num_records: int = Field(ge=0)


class ManifestEntry(BaseModel):
    """One published file as the official manifest describes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, StringConstraints(min_length=1)]
    sha256: Sha256
    size: int = Field(ge=0)


class Manifest(BaseModel):
    """The files of one dataset version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str
    version: str
    files: list[ManifestEntry]

    def entry(self, name: str) -> ManifestEntry:
        for entry in self.files:
            if entry.name == name:
                return entry
        raise ManifestMismatch(name, f"not listed in the {self.dataset} manifest")


def check_manifest(manifest: Manifest, name: str, data: bytes) -> ManifestEntry:
    """Check ``data`` (the bytes of file ``name``) against the manifest.

    Size first (cheap, and the clearer message for a truncated download), then sha256.
    Raises :class:`ManifestMismatch` naming the file; returns the matching entry.
    """
    entry = manifest.entry(name)
    if len(data) != entry.size:
        raise ManifestMismatch(name, f"size {len(data)} bytes, manifest says {entry.size}")
    actual = hashlib.sha256(data).hexdigest()
    if actual != entry.sha256:
        raise ManifestMismatch(name, f"sha256 {actual}, manifest says {entry.sha256}")
    return entry


def language_from_extension(path: str) -> str | None:
    """The language of a file name by its extension, ``None`` for one not in :data:`EXTENSIONS`."""
    dot = path.rfind(".")
    if dot < 0 or "/" in path[dot:]:
        return None
    return EXTENSIONS.get(path[dot:].lower())


PARSE_FAILED_TAG = "parse-failed"


def flag_parse(record: NormalizedRecord, pre_parses: bool, post_parses: bool) -> NormalizedRecord:
    """Tag a record whose pre- or post-text does not parse in its claimed language.

    The parse itself is ast-grep's, run by the processing activity; the record is flagged,
    not dropped, so the stats report can count how many claims were wrong.
    """
    if pre_parses and post_parses:
        return record
    failed = [name for name, ok in (("pre", pre_parses), ("post", post_parses)) if not ok]
    tags = [*record.tags, PARSE_FAILED_TAG, *(f"{PARSE_FAILED_TAG}:{n}" for n in failed)]
    return record.model_copy(update={"tags": tags})


# ---- mappers -------------------------------------------------------------------------

Mapper = Callable[[Mapping[str, Any], int], NormalizedRecord]

CANDIDATE_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    # OpenCodeEdit's generate_finetune_dataset.py writes old_code / new_code beside an
    # Alpaca ``instruction`` or ShareGPT ``messages`` prompt that embeds the instruction;
    # its triplet files use instruct_purify / code_before_purify / code_after_purify.
    "ocedataft": {
        "instruction": (
            "instruct_purify",
            "instruction",
            "descriptive_instruction",
            "lazy_instruction",
        ),
        "pre": ("old_code", "code_before_purify", "pre", "pre_code", "input", "code_before"),
        "post": ("new_code", "code_after_purify", "post", "post_code", "code_after"),
        "path": ("file", "path", "filename"),
        "lang": ("language", "lang"),
    },
    # A loader that reads AgentPack with ``datasets`` takes ``patch`` as it is, but the
    # description from whichever of these is present: the column name is not confirmed.
    "agentpack": {
        "instruction": ("description", "message", "commit_message", "pr_title"),
        "patch": ("patch",),
    },
    "marv": {
        "instruction": ("description", "refactoring_type", "type", "instruction"),
        "pre": ("code_before", "before", "original_code", "pre"),
        "post": ("code_after", "after", "refactored_code", "post"),
        "path": ("file", "path", "file_path"),
        "lang": ("language", "lang"),
    },
    "smellycode": {
        "instruction": ("smell", "smell_type", "instruction", "description"),
        "pre": ("smelly_code", "code", "before", "pre"),
        "post": ("clean_code", "refactored_code", "after", "post"),
        "path": ("file", "path", "filename"),
        "lang": ("language", "lang"),
    },
}


def _text(dataset: str, line: int, record: Mapping[str, Any], name: str) -> str:
    value = record.get(name)
    if not isinstance(value, str):
        got = "missing" if value is None else f"a {type(value).__name__}"
        raise MalformedRecord(dataset, line, name, f"expected a string, got {got}")
    return value


def _first(
    dataset: str, line: int, record: Mapping[str, Any], role: str, required: bool = True
) -> str | None:
    names = CANDIDATE_FIELDS[dataset][role]
    for name in names:
        value = record.get(name)
        if isinstance(value, str):
            return value
    if required:
        raise MalformedRecord(
            dataset, line, "|".join(names), f"no string {role} field (tried {', '.join(names)})"
        )
    return None


def _language(dataset: str, line: int, path: str | None, declared: str | None) -> str:
    by_ext = language_from_extension(path) if path else None
    if by_ext:
        return by_ext
    if declared and declared.strip():
        return re.sub(r"[^a-z0-9#+._-]", "-", declared.strip().lower())
    raise MalformedRecord(
        dataset, line, "language", "neither a known file extension nor a language"
    )


def _build(
    dataset: str,
    line: int,
    instruction: str,
    pre: str,
    post: str,
    language: str,
    tags: list[str],
    file: str | None = None,
) -> NormalizedRecord:
    if not instruction.strip():
        raise MalformedRecord(dataset, line, "instruction", "is empty")
    if pre == post:
        raise MalformedRecord(dataset, line, "post", "equals pre: the record is no edit")
    return NormalizedRecord(
        instruction=instruction.strip(),
        pre=pre,
        post=post,
        language=language,
        tags=tags,
        file=file or None,
    )


def map_commitpackft(record: Mapping[str, Any], line: int) -> NormalizedRecord:
    """CommitPackFT: ``subject`` is the instruction, ``old_contents`` → ``new_contents``."""
    ds = "commitpackft"
    path = _text(ds, line, record, "new_file")
    lang = record.get("lang")
    return _build(
        ds,
        line,
        _text(ds, line, record, "subject"),
        _text(ds, line, record, "old_contents"),
        _text(ds, line, record, "new_contents"),
        _language(ds, line, path, lang if isinstance(lang, str) else None),
        [ds, f"license:{record.get('license') or 'unknown'}"],
        path,
    )


def map_editpackft(record: Mapping[str, Any], line: int) -> NormalizedRecord:
    """EditPackFT: its own ``instruction`` (rewritten from the commit), else ``subject``."""
    ds = "editpackft"
    instruction = record.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        instruction = _text(ds, line, record, "subject")
    path = _text(ds, line, record, "new_file")
    lang = record.get("lang")
    return _build(
        ds,
        line,
        instruction,
        _text(ds, line, record, "old_contents"),
        _text(ds, line, record, "new_contents"),
        _language(ds, line, path, lang if isinstance(lang, str) else None),
        [ds, f"license:{record.get('license') or 'unknown'}"],
        path,
    )


_EMBEDDED_INSTRUCTION = re.compile(r"## Instruction:\n(.*?)\n## Code After:", re.DOTALL)


def _prompt_instruction(record: Mapping[str, Any]) -> str | None:
    """The user turn of a ShareGPT ``messages`` list, the form OpenCodeEdit's fine-tuning
    files take when they carry no Alpaca ``instruction``."""
    messages = record.get("messages")
    if not isinstance(messages, list):
        return None
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else None
    return None


def _candidate_mapper(
    dataset: str, instruction_prefix: str = "", default_language: str | None = None
) -> Mapper:
    def mapper(record: Mapping[str, Any], line: int) -> NormalizedRecord:
        instruction = _first(dataset, line, record, "instruction", required=False)
        if instruction is None:
            instruction = _prompt_instruction(record)
        if instruction is None:
            instruction = _first(dataset, line, record, "instruction")  # raises, naming all
        assert instruction is not None
        # A fine-tuning prompt holds the code too; keep only its instruction section.
        embedded = _EMBEDDED_INSTRUCTION.search(instruction)
        if embedded:
            instruction = embedded.group(1)
        pre = _first(dataset, line, record, "pre")
        post = _first(dataset, line, record, "post")
        assert pre is not None and post is not None
        path = _first(dataset, line, record, "path", required=False)
        lang = _first(dataset, line, record, "lang", required=False) or default_language
        return _build(
            dataset,
            line,
            instruction_prefix + instruction if instruction.strip() else instruction,
            pre,
            post,
            _language(dataset, line, path, lang),
            [dataset],
            path,
        )

    mapper.__doc__ = (
        f"{dataset}: the first present of the candidate fields {CANDIDATE_FIELDS[dataset]} "
        "(see the module docstring for which of them a published source confirms)."
    )
    return mapper


# ---- unified diffs (AgentPack) ------------------------------------------------------

_HUNK_HEADER = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


class PatchHunk(NamedTuple):
    """One hunk's two sides: context and removed lines, context and added lines."""

    old: str
    new: str


class PatchFile(NamedTuple):
    """One file of a unified diff; a path is ``None`` for ``/dev/null`` (created, deleted)."""

    old_path: str | None
    new_path: str | None
    hunks: list[PatchHunk]


def _diff_path(header: str) -> str | None:
    path = header.rstrip("\r\n").split("\t", 1)[0].strip()
    if path == "/dev/null":
        return None
    if path.startswith(("a/", "b/")):
        path = path[2:]
    return path


def _hunk(lines: list[str], start: int, old_count: int, new_count: int) -> tuple[PatchHunk, int]:
    """The hunk whose body starts at ``lines[start]``; returns it and the next index."""
    old: list[str] = []
    new: list[str] = []
    sides: tuple[list[str], ...] = ()
    i = start
    while i < len(lines) and (old_count > 0 or new_count > 0 or lines[i].startswith("\\")):
        text = lines[i]
        tag, body = text[:1], text[1:]
        if tag == "\\":  # "\ No newline at end of file": the line before has none
            for side in sides:
                side[-1] = side[-1].rstrip("\r\n")
        elif tag == " " or text in ("\n", "\r\n"):  # a blank context line may lose its space
            body = body if tag == " " else text
            old.append(body)
            new.append(body)
            old_count, new_count, sides = old_count - 1, new_count - 1, (old, new)
        elif tag == "-":
            old.append(body)
            old_count, sides = old_count - 1, (old,)
        elif tag == "+":
            new.append(body)
            new_count, sides = new_count - 1, (new,)
        else:
            raise ValueError(f"line {i + 1} is not part of the hunk: {text[:40]!r}")
        i += 1
    if old_count != 0 or new_count != 0:
        raise ValueError("a hunk is shorter than its @@ header says")
    return PatchHunk("".join(old), "".join(new)), i


def parse_unified_diff(patch: str) -> list[PatchFile]:
    """The files and hunks of a unified diff (``git diff`` output or plain ``diff -u``).

    Lines outside a hunk (``diff --git``, ``index``, mode lines) are skipped; a malformed
    hunk raises ``ValueError``. Pure text work: nothing is applied.
    """
    lines = patch.splitlines(keepends=True)
    files: list[PatchFile] = []
    i = 0
    while i < len(lines):
        text = lines[i]
        if text.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            files.append(PatchFile(_diff_path(text[4:]), _diff_path(lines[i + 1][4:]), []))
            i += 2
            continue
        header = _HUNK_HEADER.match(text)
        if header:
            if not files:
                raise ValueError(f"line {i + 1}: a hunk before any --- / +++ file header")
            old_count = int(header.group(1)) if header.group(1) is not None else 1
            new_count = int(header.group(2)) if header.group(2) is not None else 1
            hunk, i = _hunk(lines, i + 1, old_count, new_count)
            files[-1].hunks.append(hunk)
            continue
        i += 1
    return files


def map_agentpack(record: Mapping[str, Any], line: int) -> NormalizedRecord:
    """AgentPack (layout NOT confirmed): a commit with a description and a unified-diff
    ``patch``. Kept when the patch changes one existing file in one hunk; the hunk's sides
    are the pre- and post-text, tagged ``fragment``."""
    ds = "agentpack"
    instruction = _first(ds, line, record, "instruction")
    patch = _first(ds, line, record, "patch")
    assert instruction is not None and patch is not None
    try:
        files = parse_unified_diff(patch)
    except ValueError as exc:
        raise MalformedRecord(ds, line, "patch", f"not a unified diff: {exc}") from None
    touched = max(len(files), sum(t.startswith("diff --git ") for t in patch.splitlines()))
    if touched != 1:
        raise MalformedRecord(
            ds, line, "patch", f"changes {touched} files; only one-file edits are kept"
        )
    changed = files[0]
    if changed.old_path is None or changed.new_path is None:
        raise MalformedRecord(
            ds, line, "patch", "creates or deletes the file: there is no pre- or post-text"
        )
    if len(changed.hunks) != 1:
        raise MalformedRecord(
            ds,
            line,
            "patch",
            f"{len(changed.hunks)} hunks; only one-hunk edits are kept (the patch holds "
            "no whole file, so the pre-text is the hunk's old side)",
        )
    hunk = changed.hunks[0]
    agent = record.get("agent")
    tags = [ds, "fragment", *([f"agent:{agent}"] if isinstance(agent, str) and agent else [])]
    return _build(
        ds,
        line,
        instruction,
        hunk.old,
        hunk.new,
        _language(ds, line, changed.new_path, None),
        tags,
        changed.new_path,
    )


# OCEDataFT is Python only: the pipeline's seeds are CommitPackFT's Python subset.
map_ocedataft = _candidate_mapper("ocedataft", default_language="python")
map_marv = _candidate_mapper("marv", "Apply this refactoring: ")
map_smellycode = _candidate_mapper("smellycode", "Refactor to remove this code smell: ")

MAPPERS: dict[str, Mapper] = {
    "commitpackft": map_commitpackft,
    "ocedataft": map_ocedataft,
    "editpackft": map_editpackft,
    "agentpack": map_agentpack,
    "marv": map_marv,
    "smellycode": map_smellycode,
}


class RecordError(BaseModel):
    """A :class:`MalformedRecord` as data, for activity results and reports."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str
    line: int
    field: str
    message: str

    @classmethod
    def of(cls, exc: MalformedRecord) -> RecordError:
        return cls(dataset=exc.dataset, line=exc.line, field=exc.field, message=exc.message)

    def render(self) -> str:
        return f"{self.dataset}: line {self.line}: {self.field}: {self.message}"


class NormaliseResult(BaseModel):
    """Records that mapped, and one error per line that did not."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    records: list[NormalizedRecord]
    errors: list[RecordError]


def normalise_rows(
    dataset: str, rows: Iterable[Mapping[str, Any]], first_line: int = 1
) -> NormaliseResult:
    """Map already decoded rows (a parquet file's rows) numbered from ``first_line``."""
    mapper = MAPPERS[dataset]
    records: list[NormalizedRecord] = []
    errors: list[RecordError] = []
    for line, row in enumerate(rows, start=first_line):
        try:
            records.append(mapper(row, line))
        except MalformedRecord as exc:
            errors.append(RecordError.of(exc))
    return NormaliseResult(records=records, errors=errors)


def normalise_lines(dataset: str, lines: Iterable[str]) -> NormaliseResult:
    """Map the lines of a published JSONL file; a blank line is skipped, a line that is
    not a JSON object is a :class:`MalformedRecord` on field ``<json>``."""
    mapper = MAPPERS[dataset]
    records: list[NormalizedRecord] = []
    errors: list[RecordError] = []
    for line_no, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except (ValueError, RecursionError) as exc:
            errors.append(
                RecordError(
                    dataset=dataset, line=line_no, field="<json>", message=f"not JSON: {exc}"
                )
            )
            continue
        if not isinstance(row, dict):
            errors.append(
                RecordError(
                    dataset=dataset, line=line_no, field="<json>", message="not a JSON object"
                )
            )
            continue
        try:
            records.append(mapper(row, line_no))
        except MalformedRecord as exc:
            errors.append(RecordError.of(exc))
    return NormaliseResult(records=records, errors=errors)


# ---- processing ----------------------------------------------------------------------


def _key(*parts: str) -> bytes:
    return blake3.blake3(canonical_json(list(parts))).digest()


def dedupe(records: Iterable[NormalizedRecord]) -> tuple[list[NormalizedRecord], int]:
    """Keep the first record of each ``(instruction, pre)``; return the kept ones and how
    many were dropped. Feed all datasets through one call to dedupe across datasets."""
    seen: set[bytes] = set()
    kept: list[NormalizedRecord] = []
    dropped = 0
    for record in records:
        key = _key(record.instruction, record.pre)
        if key in seen:
            dropped += 1
            continue
        seen.add(key)
        kept.append(record)
    return kept, dropped


def input_tokens(record: NormalizedRecord, count_tokens: TokenCounter) -> int:
    """Tokens of the model input: instruction and pre-text."""
    return count_tokens(record.instruction + "\n" + record.pre)


def filter_tokens(
    records: Iterable[NormalizedRecord],
    count_tokens: TokenCounter,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> tuple[list[NormalizedRecord], int]:
    """Keep records whose input has at most ``max_tokens``; return them and the dropped count."""
    kept: list[NormalizedRecord] = []
    dropped = 0
    for record in records:
        if input_tokens(record, count_tokens) <= max_tokens:
            kept.append(record)
        else:
            dropped += 1
    return kept, dropped


def assign_split(
    record: NormalizedRecord, dev: float = 0.1, test: float = 0.1, salt: str = "srl-v1"
) -> Split:
    """Train, dev or test by a BLAKE3 hash of (salt, language group, instruction, pre).

    The same record always lands in the same split, whatever else is in the dataset or in
    which order it comes, so adding data never moves a test record into train. Hashing
    per language group keeps the ratios per language.
    """
    if dev < 0 or test < 0 or dev + test >= 1:
        raise ValueError(f"dev={dev}, test={test} are not split ratios")
    group = LANGUAGE_GROUPS.get(record.language, record.language)
    bucket = int.from_bytes(_key(salt, group, record.instruction, record.pre)[:8], "big") / 2**64
    if bucket < test:
        return "test"
    if bucket < test + dev:
        return "dev"
    return "train"


def split_by_language(
    records: Iterable[NormalizedRecord], dev: float = 0.1, test: float = 0.1
) -> dict[str, dict[Split, list[NormalizedRecord]]]:
    """``{group: {split: records}}`` for the python, javascript (JS+TS) and java groups;
    records of other languages are left out (the caller counts them)."""
    out: dict[str, dict[Split, list[NormalizedRecord]]] = {}
    for record in records:
        group = LANGUAGE_GROUPS.get(record.language)
        if group is None:
            continue
        splits = out.setdefault(group, {"train": [], "dev": [], "test": []})
        splits[assign_split(record, dev, test)].append(record)
    return out


def stats_report(title: str, records: list[NormalizedRecord], count_tokens: TokenCounter) -> str:
    """A Markdown report: record count, average input tokens, and language ratios."""
    total = len(records)
    by_lang = Counter(r.language for r in records)
    tokens: dict[str, int] = Counter()
    for r in records:
        tokens[r.language] += input_tokens(r, count_tokens)
    avg_all = sum(tokens.values()) / total if total else 0.0
    lines = [
        f"# {title}",
        "",
        f"- records: {total}",
        f"- average input tokens: {avg_all:.1f}",
        "",
        "| language | records | share | avg input tokens |",
        "| --- | ---: | ---: | ---: |",
    ]
    for lang, count in sorted(by_lang.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"| {lang} | {count} | {count / total:.1%} | {tokens[lang] / count:.1f} |")
    return "\n".join(lines) + "\n"
