"""Keel's command lines: ``keel``, ``mrp``, ``runllm``, ``srl`` and ``design``."""

from cli.lazy_iri import defer

defer()
