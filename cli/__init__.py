"""Keel's command lines: ``keel``, ``mrp``, ``runllm``, ``srl`` and ``design``."""

from activities.lazy_iri import defer

defer()
