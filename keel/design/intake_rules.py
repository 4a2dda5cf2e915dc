"""What rules can read from requirement text, before and beside the intake model.

A paragraph that says ``eu-west-1`` states the cloud (AWS) and the region; one that says
``200 GB/day``, ``under 100 ms`` or ``under $2k/month`` states a volume, an SLO and a
budget. :func:`read_rules` reads those forms (region codes, volumes, event and request
rates, latency, budgets, training cadence, compliance names, availability, retention,
workload words, an explicit request for the account baseline) into the Constraint Schema, and :func:`merge_with_rules` lays that reading
over the model's: a field the model left empty, or gave a value the text contradicts,
takes the rules' value, so the coverage check asks only about what the text does not say.

Pure: no I/O. Azure's region names (``westeurope``) imply the cloud, but the schema's
region names are dash-separated, so they are not put in ``regions``.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from keel.design.constraints import (
    BUDGET_BAND_CEILING_USD,
    BudgetBand,
    Cloud,
    Compliance,
    Constraints,
    DataClassification,
    DeploymentPref,
    WorkloadType,
    is_stated,
)
from keel.design.coverage import IntakeSnapshot

_DIRS = "north|south|east|west|central|northeast|southeast|northwest|southwest"
#: AWS: eu-west-1, us-gov-east-1 (an availability zone's letter, eu-west-1a, is dropped).
_AWS_REGION = re.compile(
    rf"(?<![\w-])((?:us|eu|ap|sa|ca|me|af|il|mx)-(?:gov-|iso-)?(?:{_DIRS})-\d{{1,2}})[a-f]?(?![\w-])"
)
#: GCP: us-central1, europe-west4 (a zone's -a suffix is dropped).
_GCP_REGION = re.compile(
    r"(?<![\w-])((?:us|europe|asia|australia|northamerica|southamerica|me|africa)-"
    rf"(?:{_DIRS})\d{{1,2}})(?:-[a-f])?(?![\w-])"
)
_AZURE_REGION = re.compile(
    r"(?<![\w-])(?:westeurope|northeurope|eastus2?|westus[23]?|centralus|northcentralus|"
    r"southcentralus|uksouth|ukwest|francecentral|germanywestcentral|swedencentral|"
    r"switzerlandnorth|norwayeast|southeastasia|eastasia|japaneast|japanwest|"
    r"australiaeast|canadacentral|brazilsouth|centralindia|koreacentral)(?![\w-])"
)
_CLOUD_NAMES: list[tuple[re.Pattern[str], Cloud]] = [
    (re.compile(r"\b(?:aws|amazon web services)\b"), Cloud.AWS),
    (re.compile(r"\b(?:gcp|google cloud(?: platform)?)\b"), Cloud.GCP),
    (re.compile(r"\b(?:azure)\b"), Cloud.AZURE),
]

_NUM = r"(\d[\d,]*(?:\.\d+)?|\.\d+)"
_MULT = r"(k|m|thousand|million|billion|bn)?"
_MULTIPLIERS = {"k": 1e3, "thousand": 1e3, "m": 1e6, "million": 1e6, "billion": 1e9, "bn": 1e9}
_PER = r"(?:/|per\b|an?\b|each\b|every\b)"
_PERIOD_S = {
    "s": 1.0, "sec": 1.0, "second": 1.0,
    "min": 60.0, "minute": 60.0,
    "h": 3600.0, "hr": 3600.0, "hour": 3600.0,
    "d": 86400.0, "day": 86400.0,
    "wk": 7 * 86400.0, "week": 7 * 86400.0,
    "mo": 30 * 86400.0, "month": 30 * 86400.0,
    "yr": 365 * 86400.0, "year": 365 * 86400.0,
}  # fmt: skip
_PERIOD = r"(s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?|d|days?|wk|weeks?|mo|months?|yr|years?)"
_GB = {"kb": 1e-6, "mb": 1e-3, "gb": 1.0, "tb": 1e3, "pb": 1e6}
_BYTES = r"(kb|mb|gb|tb|pb|gib|tib|kilobytes?|megabytes?|gigabytes?|terabytes?|petabytes?)"
#: Up to four words between a quantity and its period ("200 GB of event data per day").
_GAP = r"(?:\s+(?!per\b|an?\b|each\b|every\b)[a-z][\w-]*){0,4}?"

_VOLUME = re.compile(
    rf"{_NUM}\s*{_MULT}\s*{_BYTES}{_GAP}\s*(?:{_PER}\s*{_PERIOD}\b|(daily|hourly|monthly))"
)
_EVENTS = re.compile(
    rf"{_NUM}\s*{_MULT}\s*(?:events?|messages?|msgs?|records?|rows?){_GAP}\s*{_PER}\s*{_PERIOD}\b"
)
_REQUESTS = re.compile(
    rf"{_NUM}\s*{_MULT}\s*(?:(?:requests?|reqs?|queries|calls|predictions?|inferences?)"
    rf"{_GAP}\s*{_PER}\s*{_PERIOD}\b|(rps|qps|tps))\b"
)
_LATENCY = re.compile(
    r"(?:\b(p\d{2}(?:\.\d+)?)\b[^.;\d]{0,30}?)?"
    r"(?:under|below|less than|<=?|≤|within|at most|no more than|max(?:imum)?(?: of)?|of)?\s*"
    rf"{_NUM}\s*(ms|milliseconds?|msecs?|s|secs?|seconds?)\b"
)
_LATENCY_WORDS = re.compile(r"\b(?:latency|latencies|response|respond|p\d{2}|slo|sla)\b")
_MONEY = re.compile(
    r"(?:\$|usd\s*)\s*" + _NUM + r"\s*" + _MULT + r"(?:\s*usd)?\b"
    r"|" + _NUM + r"\s*" + _MULT + r"\s*(?:usd|dollars)\b"
)
_MONTHLY = re.compile(rf"^\s*(?:usd\b\s*)?(?:{_PER}\s*(?:month|mo)\b|monthly\b|pm\b|p/m\b)")
_YEARLY = re.compile(rf"^\s*(?:usd\b\s*)?(?:{_PER}\s*(?:year|yr)\b|annually\b|yearly\b|a year\b)")
_AVAILABILITY = re.compile(r"\b(9\d(?:\.\d+)?)\s*%(?:\s*(?:availability|uptime|available))?")
_AVAIL_WORDS = re.compile(r"\b(?:availability|uptime|available|sla)\b")
_NINES = re.compile(r"\b(two|three|four|five|2|3|4|5) nines\b")
_RETENTION = re.compile(
    rf"\b(?:retain(?:ed)?|retention(?: of)?|keep(?:s|ing)?|kept|stored?)\b[^.;]{{0,40}}?"
    rf"(?:for\s+)?{_NUM}\s*(days?|weeks?|months?|years?)\b"
)
_TRAINING = re.compile(r"\b(?:re-?train\w*|train\w*|model refresh\w*|refit\w*)\b")
_CADENCE: list[tuple[re.Pattern[str], float]] = [
    (re.compile(r"\b(?:hourly|every hour|once an hour)\b"), 720.0),
    (re.compile(r"\b(?:twice a day|twice daily|every 12 hours)\b"), 60.0),
    (re.compile(r"\b(?:nightly|daily|every day|every night|once a day|each night)\b"), 30.0),
    (re.compile(r"\b(?:weekly|every week|once a week)\b"), 4.0),
    (re.compile(r"\b(?:biweekly|fortnightly|every (?:two|2) weeks|every other week)\b"), 2.0),
    (re.compile(r"\b(?:monthly|every month|once a month)\b"), 1.0),
    (re.compile(r"\b(?:quarterly|every quarter)\b"), 1.0 / 3.0),
]
_COMPLIANCE: list[tuple[re.Pattern[str], Compliance]] = [
    (re.compile(r"\bgdpr\b"), Compliance.GDPR),
    (re.compile(r"\bhipaa\b"), Compliance.HIPAA),
    (re.compile(r"\bpci(?:[- ]?dss)?\b"), Compliance.PCI_DSS),
    (re.compile(r"\bsoc[- ]?(?:2|ii)\b"), Compliance.SOC2),
]
_WORKLOADS: list[tuple[re.Pattern[str], WorkloadType]] = [
    (
        re.compile(
            r"\b(?:batch\w*|nightly scor\w+|offline (?:scor|inferenc|predict)\w*|"
            r"re-?train\w*|training|etl)\b"
        ),
        WorkloadType.BATCH,
    ),
    (
        re.compile(
            r"\b(?:stream\w*|kafka|kinesis|pub/?sub|event hubs?|flink|"
            r"real[- ]?time (?:events?|ingest\w*|pipelines?|feeds?))\b"
        ),
        WorkloadType.STREAMING,
    ),
    (
        re.compile(
            r"\b(?:(?:low[- ]latency|real[- ]?time|online|rest|http|prediction|inference|"
            r"scoring|serving) (?:apis?|endpoints?|servic\w+|inferenc\w+|predictions?|"
            r"scoring|serving)|online serving|online inference|online predictions?|"
            r"apis? for (?:predictions?|scoring|inference)|rag|retrieval[- ]augmented|"
            r"chatbot|semantic search)\b"
        ),
        WorkloadType.ONLINE,
    ),
]
_CLASSIFICATION = re.compile(
    r"\b(public|internal|confidential|restricted)\s+data\b"
    r"|\bdata\s+(?:is|are)\s+(?:classified\s+(?:as\s+)?)?(public|internal|confidential|restricted)\b"
    r"|\bclassified\s+(?:as\s+)?(public|internal|confidential|restricted)\b"
    r"|\b(pii|phi)\b"
)
_DEPLOYMENT: list[tuple[re.Pattern[str], DeploymentPref]] = [
    (re.compile(r"\bserverless\b"), DeploymentPref.SERVERLESS),
    (
        re.compile(r"\b(?:containers?|containeri[sz]ed|kubernetes|k8s|docker)\b"),
        DeploymentPref.CONTAINERS,
    ),
]
#: Issue 38 §3: an explicit request for the account's baseline (its one-per-region AWS
#: Config, Macie, Lake Formation admins and Glue catalog encryption). Only a phrase that
#: says this deployment sets it up or owns the account: a paragraph naming GDPR, Macie
#: or AWS Config alone, or an account baseline someone else provides, leaves it off.
_ACCOUNT = r"(?:aws\s+)?account"
_ENABLE = r"\b(?:enable|turn\s+on|set\s+up|switch\s+on|activate)"
_SINGLETON = r"(?:config|macie|lake\s+formation(?:\s+admin\w*)?)"
_BASELINE: list[re.Pattern[str]] = [
    # "set up the account baseline", "we own the account-wide baseline".
    re.compile(
        r"\b(?:set(?:s|ting)?[\s-]*up|own|owns|provision\w*|create|creates|deploy|deploys|"
        r"enable|enables|include|includes|manage|manages|bootstrap\w*)\s+"
        rf"(?:the\s+|our\s+|its\s+|an?\s+)?(?:{_ACCOUNT}(?:[- ]wide|['\u2019]s)?|account_)\s*baseline\b"
    ),
    # "this account is dedicated to the project", "a dedicated AWS account".
    re.compile(rf"\b(?:the|this|our)\s+{_ACCOUNT}\s+is\s+dedicated\s+to\b"),
    re.compile(
        rf"\b(?:its|our|their|a|an|the)\s+(?:own\s+)?dedicated\s+{_ACCOUNT}\b"
        r"(?!\s*(?:manager|team|rep\w*|executive|owner|id|number))"
    ),
    # "we own the account".
    re.compile(
        rf"\bwe\s+own\s+(?:the|this)\s+(?:(?:whole|entire)\s+)?{_ACCOUNT}\b(?!\s*(?:id|number))"
    ),
    # "enable AWS Config and Macie for the account", "set up account-wide Macie".
    re.compile(
        rf"{_ENABLE}\s+(?:aws\s+|amazon\s+)?{_SINGLETON}\b[^.;]{{0,60}}?"
        rf"\b(?:for|in|across|on)\s+(?:the|this|our)\s+(?:(?:whole|entire)\s+)?{_ACCOUNT}\b"
        r"(?!\s*(?:manager|team|id|number))"
    ),
    re.compile(
        rf"{_ENABLE}\s+(?:an?\s+|the\s+)?account[- ]wide\s+(?:aws\s+|amazon\s+)?{_SINGLETON}\b"
    ),
]
#: Said before a baseline phrase, it is no request ("we won't set up the account baseline").
_BASELINE_NEGATED = re.compile(r"(?:n['\u2019]t|\bcannot|\bnot)\b[\w\s-]{0,20}$")
_NEGATORS = re.compile(r"\b(?:no|not|without|never|nor|avoid|excluding)\b[\w\s/-]{0,20}$")
#: An upper bound is no negation: "no more than $2k a month", "not to exceed 2 TB per day".
_BOUNDS = re.compile(
    r"\b(?:no|not)\s+(?:more|greater|higher|longer|slower|later)\s+than\b"
    r"|\bnot\s+(?:to\s+)?exceed\w*|\bnot\s+over\b"
)
_NEGATED_AFTER = re.compile(
    r"^[\w\s-]{0,12}\b(?:does not|doesn't|do not|don't|is not|isn't|not)\s+(?:apply|applies|required|needed|in scope)"
)

_NUMBER_WORDS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "fifteen": 15, "twenty": 20,
    "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80,
    "ninety": 90,
}  # fmt: skip
_NINE_WORDS = {"two": "2", "three": "3", "four": "4", "five": "5"}
_SCALE_WORDS = {"hundred": 100, "thousand": 1000, "million": 1_000_000}
_WORD_NUMBER = re.compile(
    r"\b(?:(?:"
    + "|".join(_NUMBER_WORDS)
    + r"|a)(?:[\s-]+(?:"
    + "|".join(_NUMBER_WORDS)
    + r"))?)(?:\s+(?:hundred|thousand|million))+\b|\b(?:"
    + "|".join(_NUMBER_WORDS)
    + r")\b"
)


class RulesReading(BaseModel):
    """The fields rules read from the text, and each field's words in the text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    constraints: Constraints = Field(default_factory=Constraints)
    evidence: dict[str, str] = Field(default_factory=dict)
    #: Workload kinds the text rules out ("no streaming"): a model's claim of one is dropped.
    excluded_workloads: list[WorkloadType] = Field(default_factory=list)


#: One field read from the text: its name, its value, the words that said it.
_Reading = tuple[str, Any, str]


def _place_readings(t: str) -> list[_Reading]:
    """The regions named, and the cloud when the regions and cloud names imply one."""
    readings: list[_Reading] = []
    regions, clouds, region_words = _regions(t)
    if regions:
        readings.append(("regions", regions, ", ".join(region_words)))
    named = {cloud for pattern, cloud in _CLOUD_NAMES if pattern.search(t)}
    implied = clouds | named
    if len(implied) == 1:
        (cloud,) = implied
        readings.append(("cloud", cloud.value, ", ".join(region_words) or cloud.value))
    return readings


def _throughput_readings(t: str) -> list[_Reading]:
    """The data volume per day, events per second and requests per second stated."""
    throughput: dict[str, float] = {}
    words: list[str] = []
    if m := _first(_VOLUME, t):
        gb = _number(m.group(1), m.group(2)) * _gb(m.group(3))
        per_s = _period_s(m.group(4) or m.group(5))
        throughput["data_gb_per_day"] = round(gb * 86400.0 / per_s, 6)
        words.append(m.group(0))
    if m := _first(_EVENTS, t):
        throughput["events_per_s"] = round(
            _number(m.group(1), m.group(2)) / _period_s(m.group(3)), 6
        )
        words.append(m.group(0))
    if m := _first(_REQUESTS, t):
        n = _number(m.group(1), m.group(2))
        per_s = 1.0 if m.group(4) else _period_s(m.group(3))
        throughput["requests_per_s"] = round(n / per_s, 6)
        words.append(m.group(0))
    return [("throughput", throughput, "; ".join(words))] if throughput else []


def _quantity_readings(t: str) -> list[_Reading]:
    """Latency SLO, budget band, availability, retention and training cadence."""
    readings: list[_Reading] = []
    if latency := _latency(t):
        readings.append(("sla_latency_ms", latency[0], latency[1]))
    if budget := _budget(t):
        readings.append(("budget_band", budget[0].value, budget[1]))
    if avail := _availability(t):
        readings.append(("availability_target", avail[0], avail[1]))
    if retention := _retention(t):
        readings.append(("retention_days", retention[0], retention[1]))
    if cadence := _cadence(t):
        readings.append(("training_runs_per_month", cadence[0], cadence[1]))
    return readings


def _kind_readings(t: str) -> tuple[list[_Reading], set[WorkloadType]]:
    """Compliance regimes, workload kinds, data classification, deployment and an
    account-baseline request named (not negated), and the workload kinds the text rules
    out."""
    readings: list[_Reading] = []
    compliance = [(c, m.group(0)) for p, c in _COMPLIANCE for m in _unnegated(p, t)[:1]]
    if compliance:
        regimes = [c.value for c, _ in compliance]
        readings.append(("compliance", regimes, ", ".join(w for _, w in compliance)))
    workloads, excluded = _workloads(t)
    if workloads:
        kinds = [w.value for w, _ in workloads]
        readings.append(("workload_types", kinds, ", ".join(w for _, w in workloads)))
    if cls := _classification(t):
        readings.append(("data_classification", cls[0].value, cls[1]))
    prefs = {d: m.group(0) for p, d in _DEPLOYMENT for m in _unnegated(p, t)[:1]}
    if len(prefs) == 1:
        ((pref, words),) = prefs.items()
        readings.append(("deployment_pref", pref.value, words))
    if baseline := _baseline(t):
        readings.append(("account_baseline", True, baseline))
    return readings, excluded


def read_rules(text: str) -> RulesReading:
    """Every field rules can read from ``text``; fields they cannot read stay unstated."""
    t = _words_to_numbers(text.lower().replace("\u2011", "-").replace("\u2013", "-"))
    kinds, excluded = _kind_readings(t)
    readings = [*_place_readings(t), *_throughput_readings(t), *_quantity_readings(t), *kinds]
    return RulesReading(
        constraints=Constraints.model_validate({f: value for f, value, _ in readings}),
        evidence={f: words.strip() for f, _, words in readings},
        excluded_workloads=sorted(excluded),
    )


def merge_with_rules(
    snapshot: IntakeSnapshot, rules: RulesReading
) -> tuple[IntakeSnapshot, dict[str, str]]:
    """The model's snapshot checked against the rules' reading, and which source gave
    each stated field (``"rules"``, ``"model"`` or ``"model+rules"``).

    A field the rules read takes their value: the model left it empty, or gave a value
    the text contradicts (a region or a compliance regime the text does not name,
    another budget). Workload types are the union of both (the model may read a kind the
    rules' words miss), less any the text rules out; throughput merges part by part. A field the rules read is no longer ambiguous nor unfit.
    """
    model = snapshot.constraints
    ruled = rules.constraints
    merged = model.model_dump(mode="json")
    source: dict[str, str] = {}
    for field in Constraints.model_fields:
        by_model, by_rules = is_stated(model, field), is_stated(ruled, field)
        if not by_rules:
            if by_model:
                source[field] = "model"
            continue
        mine = getattr(ruled, field)
        theirs = getattr(model, field)
        value: Any
        if field == "workload_types":
            value = sorted({*mine, *theirs} - set(rules.excluded_workloads))
        elif field == "throughput" and theirs is not None:
            value = {**theirs.model_dump(exclude_none=True), **mine.model_dump(exclude_none=True)}
        else:
            value = mine
        merged[field] = value.model_dump() if isinstance(value, BaseModel) else value
        agrees = by_model and _same(
            theirs, Constraints.model_validate({field: merged[field]}), field
        )
        source[field] = "model+rules" if agrees else "rules"
    if rules.excluded_workloads and not is_stated(ruled, "workload_types"):
        merged["workload_types"] = sorted(set(model.workload_types) - set(rules.excluded_workloads))
    stated_by_rules = {f for f in Constraints.model_fields if is_stated(ruled, f)}
    out = IntakeSnapshot(
        constraints=Constraints.model_validate(merged),
        ambiguous={f: w for f, w in snapshot.ambiguous.items() if f not in stated_by_rules},
        unfit={f: w for f, w in snapshot.unfit.items() if f not in stated_by_rules},
    )
    return out, source


# --- readers ---------------------------------------------------------------------------


def _same(theirs: Any, merged: Constraints, field: str) -> bool:
    value = getattr(merged, field)
    if isinstance(theirs, list):
        return sorted(theirs) == sorted(value)
    return bool(theirs == value)


def _regions(t: str) -> tuple[list[str], set[Cloud], list[str]]:
    regions: list[str] = []
    clouds: set[Cloud] = set()
    words: list[str] = []
    for pattern, cloud in ((_AWS_REGION, Cloud.AWS), (_GCP_REGION, Cloud.GCP)):
        for m in pattern.finditer(t):
            if m.group(1) not in regions:
                regions.append(m.group(1))
                words.append(m.group(0))
            clouds.add(cloud)
    for m in _AZURE_REGION.finditer(t):
        clouds.add(Cloud.AZURE)
        words.append(m.group(0))
    return sorted(regions), clouds, words


def _first(pattern: re.Pattern[str], t: str) -> re.Match[str] | None:
    found = _unnegated(pattern, t)
    return found[0] if found else None


def _unnegated(pattern: re.Pattern[str], t: str) -> list[re.Match[str]]:
    """The matches not ruled out by the words around them ("no streaming", "HIPAA does
    not apply")."""
    out = []
    for m in pattern.finditer(t):
        before = t[max(0, m.start() - 24) : m.start()]
        before = _BOUNDS.sub(" ", re.split(r"[.;,:()]", before)[-1])
        if _NEGATORS.search(before) or _NEGATED_AFTER.match(t[m.end() : m.end() + 40]):
            continue
        out.append(m)
    return out


def _number(digits: str, mult: str | None) -> float:
    return float(digits.replace(",", "")) * _MULTIPLIERS.get(mult or "", 1.0)


def _gb(unit: str) -> float:
    u = unit.lower()
    key = u[:2] if len(u) <= 3 else {"k": "kb", "m": "mb", "g": "gb", "t": "tb", "p": "pb"}[u[0]]
    return _GB[key]


def _period_s(word: str) -> float:
    w = {"daily": "day", "hourly": "hour", "monthly": "month"}.get(word, word)
    if w not in _PERIOD_S:
        w = w[:-1] if w.endswith("s") and w[:-1] in _PERIOD_S else w
    return _PERIOD_S.get(w, 1.0)


def _latency(t: str) -> tuple[int, str] | None:
    """The p95 bound if one is named, else the highest percentile's, else the first."""
    found: list[tuple[float, float, str]] = []  # (percentile, ms, words)
    for m in _unnegated(_LATENCY, t):
        pct_word, digits, unit = m.group(1), m.group(2), m.group(3)
        # "5k events/s": a rate, not a time.
        if t[max(0, m.start(2) - 1) : m.start(2)] == "/" or t[m.start(3) - 1 : m.start(3)] == "/":
            continue
        ms = float(digits.replace(",", ""))
        if not unit.startswith("m"):
            context = t[max(0, m.start() - 40) : m.end() + 20]
            if not _LATENCY_WORDS.search(context):
                continue
            ms *= 1000.0
        if ms <= 0:
            continue
        pct = float(pct_word[1:]) if pct_word else -1.0
        found.append((pct, ms, m.group(0)))
    if not found:
        return None
    p95 = [f for f in found if f[0] == 95.0]
    pick = (
        p95[0]
        if p95
        else max(found, key=lambda f: f[0])
        if any(f[0] > 0 for f in found)
        else found[0]
    )
    ms = round(pick[1])
    return (ms, pick[2]) if 0 < ms <= 600_000 else None


def _budget(t: str) -> tuple[BudgetBand, str] | None:
    for m in _unnegated(_MONEY, t):
        digits = m.group(1) or m.group(3)
        mult = m.group(2) or m.group(4)
        amount = _number(digits, mult)
        after = t[m.end() : m.end() + 24]
        before = t[max(0, m.start() - 40) : m.start()]
        if _YEARLY.match(after):
            amount /= 12.0
        elif not (_MONTHLY.match(after) or re.search(r"\bmonthly\b[^.;$]*$", before)):
            continue
        if amount <= 0:
            continue
        for band, ceiling in BUDGET_BAND_CEILING_USD.items():
            if amount <= ceiling:
                return band, (m.group(0) + after).split(",")[0].strip()
        return BudgetBand.ENTERPRISE, (m.group(0) + after).split(",")[0].strip()
    return None


def _availability(t: str) -> tuple[float, str] | None:
    for m in _AVAILABILITY.finditer(t):
        context = t[max(0, m.start() - 30) : m.end() + 20]
        value = float(m.group(1))
        if _AVAIL_WORDS.search(context) and 90.0 <= value < 100.0:
            return value, m.group(0)
    if said := _NINES.search(t):
        word = _NINE_WORDS.get(said.group(1), said.group(1))
        return {"2": 99.0, "3": 99.9, "4": 99.99, "5": 99.999}[word], said.group(0)
    return None


def _retention(t: str) -> tuple[int, str] | None:
    if m := _first(_RETENTION, t):
        n = float(m.group(1).replace(",", ""))
        unit = m.group(2).rstrip("s")
        days = round(n * {"day": 1, "week": 7, "month": 30, "year": 365}[unit])
        if 1 <= days <= 36_500:
            return days, m.group(0)
    return None


def _cadence(t: str) -> tuple[float, str] | None:
    """A cadence word in the same sentence as a training word."""
    for sentence in re.split(r"[.;\n]", t):
        if not _TRAINING.search(sentence):
            continue
        for clause in [sentence, *re.split(r",", sentence)]:
            if not _TRAINING.search(clause):
                continue
            for pattern, runs in _CADENCE:
                if m := pattern.search(clause):
                    return runs, m.group(0) + " " + _TRAINING.search(clause).group(0)  # type: ignore[union-attr]
    return None


def _workloads(t: str) -> tuple[list[tuple[WorkloadType, str]], set[WorkloadType]]:
    found: list[tuple[WorkloadType, str]] = []
    excluded: set[WorkloadType] = set()
    for pattern, kind in _WORKLOADS:
        kept = _unnegated(pattern, t)
        if kept:
            found.append((kind, kept[0].group(0)))
        elif any(True for _ in pattern.finditer(t)):
            excluded.add(kind)
    return found, excluded


def _baseline(t: str) -> str | None:
    """The words of an explicit account-baseline request, or ``None``."""
    for pattern in _BASELINE:
        for m in _unnegated(pattern, t):
            before = re.split(r"[.;,:()]", t[max(0, m.start() - 30) : m.start()])[-1]
            if not _BASELINE_NEGATED.search(before):
                return m.group(0)
    return None


def _classification(t: str) -> tuple[DataClassification, str] | None:
    for m in _unnegated(_CLASSIFICATION, t):
        word = next(g for g in m.groups() if g)
        if word in ("pii", "phi"):
            return DataClassification.RESTRICTED, m.group(0)
        return DataClassification(word), m.group(0)
    return None


def _words_to_numbers(t: str) -> str:
    """ "two hundred gigabytes" to "200 gigabytes"; "a thousand" to "1000"."""

    def value(m: re.Match[str]) -> str:
        total, current = 0, 0
        for word in re.split(r"[\s-]+", m.group(0)):
            if word == "a":
                current = 1
            elif word in _NUMBER_WORDS:
                current += _NUMBER_WORDS[word]
            elif word in _SCALE_WORDS:
                scale = _SCALE_WORDS[word]
                if scale == 100:
                    current = max(current, 1) * 100
                else:
                    total += max(current, 1) * scale
                    current = 0
        return str(total + current)

    return _WORD_NUMBER.sub(value, t)
