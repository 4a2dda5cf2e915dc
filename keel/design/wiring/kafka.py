"""Rule ``kafka``: clients of an MSK cluster authenticate the way it admits them, and every
topic they read is created.

An MSK cluster admits clients by the modes of its ``client_authentication`` (IAM, SASL/
SCRAM, mutual TLS, or none). A client that connects another way is refused at its first
request: the Python code's Kafka client settings (``security.protocol`` and the SASL
mechanism, as ``confluent-kafka`` dicts or ``kafka-python`` keywords), the bootstrap broker
list the Terraform hands out (``bootstrap_brokers_sasl_iam`` is the IAM port), and a Lambda
event source mapping's ``source_access_configuration`` must each name a mode the cluster
admits. Topics: MSK has no AWS API for them and a cluster creates none on first use unless
its configuration says ``auto.create.topics.enable=true``, so every topic a mapping reads
must be created by the tree: a ``kafka_topic`` resource, or a bootstrap (an
``aws_lambda_invocation`` whose input lists ``topics``) that the mapping waits for.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from keel.design.wiring.model import _STRING, Block, Finding, TfModule
from keel.design.wiring.repo import Repo
from keel.design.wiring.terraform import _all_text, _balanced, _unwrap

MODES = ("iam", "scram", "tls", "none")
_BROKERS = re.compile(r"\baws_msk_cluster\.(\w+)\.bootstrap_brokers(\w*)")
#: Each bootstrap broker attribute, by the modes it serves.
_BROKER_MODES: dict[str, frozenset[str]] = {
    "": frozenset({"none"}),
    "_tls": frozenset({"tls", "none"}),
    "_sasl_iam": frozenset({"iam"}),
    "_sasl_scram": frozenset({"scram"}),
}
_ACCESS_MODES = {
    "SASL_SCRAM_512_AUTH": "scram",
    "SASL_SCRAM_256_AUTH": "scram",
    "CLIENT_CERTIFICATE_TLS_AUTH": "tls",
    "BASIC_AUTH": "scram",
}


@dataclass(frozen=True)
class Cluster:
    module: TfModule
    block: Block
    modes: frozenset[str]

    @property
    def where(self) -> str:
        return f"aws_msk_cluster.{self.block.name} ({self.module.dir}/)"


def _flag(body: object, key: str) -> bool:
    value = _unwrap(body).get(key) if isinstance(_unwrap(body), dict) else None
    return value is True or value == "true"


def cluster_modes(block: Block) -> frozenset[str]:
    """How an ``aws_msk_cluster`` admits clients (no ``client_authentication``: none)."""
    auth = _unwrap(block.body.get("client_authentication"))
    if not isinstance(auth, dict):
        return frozenset({"none"})
    modes: set[str] = set()
    sasl = _unwrap(auth.get("sasl"))
    if isinstance(sasl, dict):
        if _flag(sasl, "iam"):
            modes.add("iam")
        if _flag(sasl, "scram"):
            modes.add("scram")
    if auth.get("tls"):
        modes.add("tls")
    if _flag(auth, "unauthenticated"):
        modes.add("none")
    return frozenset(modes)


def _clusters(repo: Repo) -> list[Cluster]:
    return [
        Cluster(mod, block, cluster_modes(block))
        for mod in repo.modules.values()
        for block in mod.of_kind("aws_msk_cluster")
    ]


def client_mode(protocol: str, mechanism: str) -> str | None:
    """The mode a Kafka client's ``security.protocol`` and SASL mechanism connect with."""
    protocol, mechanism = protocol.upper(), mechanism.upper()
    if protocol in ("PLAINTEXT",):
        return "none"
    if protocol == "SSL":
        return "tls"
    if protocol.startswith("SASL"):
        if mechanism in ("OAUTHBEARER", "AWS_MSK_IAM"):
            return "iam"
        if mechanism.startswith("SCRAM"):
            return "scram"
    return None


@dataclass(frozen=True)
class ClientSettings:
    file: str
    line: int
    protocol: str
    mechanism: str


def _const(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def client_settings(path: str, text: str) -> list[ClientSettings]:
    """Kafka client settings in Python code: ``{"security.protocol": ..., "sasl.mechanism(s)":
    ...}`` dicts and ``security_protocol=`` / ``sasl_mechanism=`` keywords."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    out: list[ClientSettings] = []
    for node in ast.walk(tree):
        pairs: dict[str, str | None] = {}
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                name = _const(key)
                if name is not None:
                    pairs[name.replace("_", ".")] = _const(value)
        elif isinstance(node, ast.Call):
            pairs = {(k.arg or "").replace("_", "."): _const(k.value) for k in node.keywords}
        protocol = pairs.get("security.protocol")
        if protocol is None:
            continue
        mechanism = pairs.get("sasl.mechanisms") or pairs.get("sasl.mechanism") or ""
        out.append(ClientSettings(path, getattr(node, "lineno", 0), protocol, mechanism))
    return out


def _shown(modes: frozenset[str]) -> str:
    return ", ".join(m for m in MODES if m in modes) or "nothing"


def _auth_findings(repo: Repo, clusters: list[Cluster]) -> list[Finding]:
    out: list[Finding] = []
    admitted = frozenset().union(*(c.modes for c in clusters))
    named = clusters[0].where if len(clusters) == 1 else "the MSK clusters"
    for path in sorted(p for p in repo.files if p.endswith(".py")):
        for cs in client_settings(path, repo.files[path]):
            mode = client_mode(cs.protocol, cs.mechanism)
            if mode is None or mode not in admitted:
                how = cs.protocol + (f" with SASL mechanism {cs.mechanism}" if cs.mechanism else "")
                out.append(
                    Finding(
                        "kafka",
                        path,
                        f"line {cs.line}: a Kafka client connects with security.protocol "
                        f"{how} ({mode or 'no auth mode MSK knows'}), but {named} admits "
                        f"{_shown(admitted)}",
                    )
                )
    for mod in repo.modules.values():
        for path in sorted(p for p in repo.files if p.startswith(f"{mod.dir}/")):
            if not path.endswith(".tf") or path.count("/") != mod.dir.count("/") + 1:
                continue
            for m in _BROKERS.finditer(repo.files[path]):
                cluster = next(
                    (c for c in clusters if c.module is mod and c.block.name == m.group(1)), None
                )
                serves = _BROKER_MODES.get(m.group(2).replace("_public", ""))
                if cluster is None or serves is None or serves & cluster.modes:
                    continue
                out.append(
                    Finding(
                        "kafka",
                        path,
                        f"{m.group(0)} is the broker list for {_shown(serves)} clients, but "
                        f"{cluster.where} admits {_shown(cluster.modes)}",
                    )
                )
        for esm in mod.of_kind("aws_lambda_event_source_mapping"):
            if not esm.body.get("topics"):
                continue
            access = esm.body.get("source_access_configuration") or []
            types = [
                str(_unwrap(a).get("type", ""))
                for a in (access if isinstance(access, list) else [access])
                if isinstance(_unwrap(a), dict)
            ]
            modes = {_ACCESS_MODES[t] for t in types if t in _ACCESS_MODES} or {"iam", "none"}
            if not modes & admitted:
                out.append(
                    Finding(
                        "kafka",
                        esm.file,
                        f"aws_lambda_event_source_mapping.{esm.name} reads with "
                        f"{_shown(frozenset(modes)).replace(', ', ' or ')} auth, but {named} admits "
                        f"{_shown(admitted)}",
                    )
                )
    return out


def _auto_creates(repo: Repo) -> bool:
    """Whether a cluster configuration lets topics be created on first use."""
    for mod in repo.modules.values():
        for conf in mod.of_kind("aws_msk_configuration"):
            props = str(conf.body.get("server_properties", ""))
            if re.search(r"auto\.create\.topics\.enable\s*=\s*true", props):
                return True
    return False


def bootstrap_topics(block: Block) -> set[str]:
    """The topic names an ``aws_lambda_invocation``'s input lists under ``topics``."""
    text = str(block.body.get("input", ""))
    names: set[str] = set()
    for m in re.finditer(r'"topics"\s*:\s*\[', text):
        listed = _balanced(text, m.end() - 1)
        objects = re.findall(rf'"name"\s*:\s*{_STRING}', listed)
        names |= set(objects) if objects else set(re.findall(_STRING, listed))
    return names


def _topic_findings(repo: Repo, clusters: list[Cluster]) -> list[Finding]:
    out: list[Finding] = []
    created: dict[str, list[tuple[TfModule, Block]]] = {}
    for mod in repo.modules.values():
        for inv in mod.of_kind("aws_lambda_invocation"):
            for name in bootstrap_topics(inv):
                created.setdefault(name, []).append((mod, inv))
        for res in mod.of_kind("kafka_topic"):
            topic = res.body.get("name")
            if isinstance(topic, str):
                created.setdefault(topic, []).append((mod, res))
    if _auto_creates(repo):
        return out
    for mod in repo.modules.values():
        for esm in mod.of_kind("aws_lambda_event_source_mapping"):
            topics = esm.body.get("topics")
            if not isinstance(topics, list):
                continue
            waits = _all_text(esm.body.get("depends_on", []))
            for topic in (t for t in topics if isinstance(t, str)):
                makers = created.get(topic, [])
                where = f"aws_lambda_event_source_mapping.{esm.name}"
                if not makers:
                    out.append(
                        Finding(
                            "kafka",
                            esm.file,
                            f"{where} reads topic {topic}, which nothing creates (MSK makes "
                            "no topic on first use: a kafka_topic resource or a bootstrap "
                            "aws_lambda_invocation listing it under topics)",
                        )
                    )
                    continue
                here = [b for m, b in makers if m is mod and b.kind == "aws_lambda_invocation"]
                if here and not any(f"aws_lambda_invocation.{b.name}" in waits for b in here):
                    out.append(
                        Finding(
                            "kafka",
                            esm.file,
                            f"{where} reads topic {topic} but does not wait for "
                            f"aws_lambda_invocation.{here[0].name}, which creates it "
                            "(depends_on): the mapping may subscribe before the topic exists",
                        )
                    )
    if clusters and not created:
        for c in clusters:
            out.append(
                Finding(
                    "kafka",
                    c.block.file,
                    f"{c.where}: no topic is created on it (a kafka_topic resource or a "
                    "bootstrap aws_lambda_invocation listing topics) and it creates none on "
                    "first use, so producers and consumers have no topic to use",
                )
            )
    return out


def check_kafka(repo: Repo) -> list[Finding]:
    clusters = _clusters(repo)
    if not clusters:
        return []
    return [*_auth_findings(repo, clusters), *_topic_findings(repo, clusters)]
