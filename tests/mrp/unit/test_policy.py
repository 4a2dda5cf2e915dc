"""Policy as tests: every admission rule has an invalid job that makes it fire, alone.

Each ``mrp_jobs/invalid/pNNN_*.yaml`` says in its header which rule must fire where
(``# expect: RULE path``) and which caps differ from ``caps.yaml`` (``# caps: {...}``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from keel.mrp import AllowEntry, Caps, PolicyViolation, Registry, compile_job
from keel.mrp.dsl import parse_job
from keel.mrp.normalize import FileRef, normalize_job
from keel.mrp.policy import RULES, RULES_BY_ID, admit
from tests.mrp.unit.mrp_jobs import invalid_jobs, job_text, load_caps, load_registry

REGISTRY = load_registry()
CAPS = load_caps()


def header(text: str) -> tuple[list[tuple[str, str]], Caps]:
    expects = [
        (m.group(1), m.group(2)) for m in re.finditer(r"^# expect: (\S+) (\S+)$", text, re.M)
    ]
    caps_line = re.search(r"^# caps: (.+)$", text, re.M)
    caps = load_caps(**yaml.safe_load(caps_line.group(1))) if caps_line else CAPS
    return expects, caps


def files_of(text: str) -> list[FileRef] | None:
    """The resolved files a job with ``inputs.files`` is compiled with (``# files: [...]``),
    as the compile activity would list them."""
    line = re.search(r"^# files: (.+)$", text, re.M)
    return [FileRef(**f) for f in yaml.safe_load(line.group(1))] if line else None


def naive_line(text: str, path: str) -> int:
    """The line of a dotted path found by plain text search (an oracle independent of the
    YAML marks): each key is the first later line that starts with ``key:``."""
    lines = text.splitlines()
    start = 0
    for part in path.split("."):
        key, _, index = part.partition("[")
        for n in range(start, len(lines)):
            if lines[n].lstrip().startswith(f"{key}:"):
                start = n
                break
        else:
            return 1  # absent from the file: the report points at the top
        if index:  # key[i]: the i-th "- " item after the key
            items = [n for n in range(start + 1, len(lines)) if lines[n].lstrip().startswith("- ")]
            start = items[int(index.rstrip("]"))]
    return start + 1


def test_every_rule_has_an_invalid_job():
    covered = {rule for p in invalid_jobs() for rule, _ in header(p.read_text())[0]}
    assert covered == set(RULES_BY_ID)


def test_rule_ids_are_unique_and_ordered():
    ids = [r.rule_id for r in RULES]
    assert ids == sorted(set(ids))
    assert all(re.fullmatch(r"MRP-P\d{3}", i) for i in ids)


@pytest.mark.parametrize("path", invalid_jobs(), ids=lambda p: p.stem)
def test_invalid_job_is_refused_by_its_rule(path: Path):
    text = path.read_text()
    expects, caps = header(text)
    assert expects, f"{path.name} has no '# expect:' line"
    with pytest.raises(PolicyViolation) as info:
        compile_job(text, REGISTRY, caps, resolved_files=files_of(text), source=path.name)
    violations = info.value.report.violations
    assert sorted((v.rule_id, v.path) for v in violations) == sorted(expects)
    assert info.value.rule_ids == [v.rule_id for v in violations]
    for v in violations:
        assert v.line == naive_line(text, v.path), v
        assert v.title == RULES_BY_ID[v.rule_id].title
        assert v.rule_id in str(info.value)
    outcomes = {o.rule_id: o.status for o in info.value.report.rules_evaluated}
    assert list(outcomes) == [r.rule_id for r in RULES]
    for rule_id, _ in expects:
        assert outcomes[rule_id] == "violated"


@pytest.mark.parametrize(
    "path",
    # Signatures have their own control below: no sample job uses only signed operators.
    [p for p in invalid_jobs() if "require_signatures" not in p.read_text()],
    ids=lambda p: p.stem,
)
def test_same_caps_admit_a_valid_job(path: Path):
    # The control: under the caps each invalid job is judged by, a valid job passes, so
    # the refusal above is the edit's doing.
    _, caps = header(path.read_text())
    name = "valid/sentiment.yaml" if caps.require_approval else "valid/wordcount.yaml"
    assert compile_job(job_text(name), REGISTRY, caps).policy_report.admitted


@pytest.mark.parametrize("name", ["wordcount.yaml", "sentiment.yaml", "wordcount_reordered.yaml"])
def test_valid_jobs_pass_every_rule(name: str):
    result = compile_job(job_text(f"valid/{name}"), REGISTRY, CAPS)
    report = result.policy_report
    assert report.admitted and report.violations == []
    assert [(o.rule_id, o.status) for o in report.rules_evaluated] == [
        (r.rule_id, "passed") for r in RULES
    ]
    assert report.caps_digest == CAPS.digest()


def test_signed_operators_pass_the_signature_rule():
    caps = load_caps(require_signatures=True)
    text = (
        job_text("valid/wordcount.yaml")
        .replace("tokens-count@1.0.0", "json-writer@1.0.0")
        .replace("sum-counts@1.0.0", "json-writer@1.0.0")
    )
    job = normalize_job(parse_job(text))
    report = admit(job, REGISTRY, caps)
    assert "MRP-P014" not in {v.rule_id for v in report.violations}
    # The same edit makes the map and reduce steps the wrong kind: rules are independent.
    assert {v.rule_id for v in report.violations} == {"MRP-P008"}


def test_all_violations_are_reported_at_once():
    text = (
        job_text("valid/wordcount.yaml")
        .replace("max_workers: 4", "max_workers: 64")
        .replace("sum-counts@1.0.0", "sum-counts@9.0.0")
        .replace("destination: out/wordcount.json", "destination: s3://elsewhere/x.json")
    )
    with pytest.raises(PolicyViolation) as info:
        compile_job(text, REGISTRY, CAPS)
    assert info.value.rule_ids == ["MRP-P001", "MRP-P006", "MRP-P009"]
    outcomes = {o.rule_id: o for o in info.value.report.rules_evaluated}
    # Without every operator the job cannot be estimated: the budget rule says so
    # instead of passing, and the refusal stands on P006.
    assert outcomes["MRP-P011"].status == "skipped"
    assert "cannot be estimated" in outcomes["MRP-P011"].reason
    assert info.value.report.estimate is None


def test_pinned_digest_mismatch_is_not_allow_listed():
    registry = Registry(
        operators=REGISTRY.operators,
        allow=[
            AllowEntry(ref=e.ref, code_digest=e.code_digest)
            if e.ref != "tokens-count@1.0.0"
            else AllowEntry(ref=e.ref, code_digest="blake3:" + "0" * 64)
            for e in REGISTRY.allow
        ],
    )
    with pytest.raises(PolicyViolation) as info:
        compile_job(job_text("valid/wordcount.yaml"), registry, CAPS)
    [v] = info.value.report.violations
    assert v.rule_id == "MRP-P007"
    assert "but the allow-list pins blake3:000" in v.message


def test_default_caps_allow_no_egress():
    with pytest.raises(PolicyViolation) as info:
        compile_job(job_text("valid/sentiment.yaml"), REGISTRY, Caps())
    assert "MRP-P010" in info.value.rule_ids


def test_report_without_lines_still_names_paths():
    text = job_text("valid/wordcount.yaml").replace("max_workers: 4", "max_workers: 64")
    report = admit(normalize_job(parse_job(text)), REGISTRY, CAPS)
    [v] = report.violations
    assert (v.rule_id, v.path, v.line) == ("MRP-P001", "policy.max_workers", None)
    assert v.render() == (
        "MRP-P001 max_workers over cap at policy.max_workers: asks for 64 workers; the cap is 16"
    )
