"""What an id or a name Keel takes from a user may hold: one rule for every family.

An id starts with a letter or a digit and goes on with letters, digits, ``.``, ``_`` and
``-``: safe in a workflow id, a file name, a URL path segment and a search attribute,
with no quoting. Ids are at most 128 characters; names that sit inside other ids
(a project, a decision set, an actor endpoint) at most 64.
"""

from __future__ import annotations

import re

#: Collection, task, run and job ids.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
#: Names that become part of other ids (projects, decision sets, actor endpoints).
SHORT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
#: A gate's name, which may start with any of the id characters.
GATE_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,128}$"

ID_RE = re.compile(ID_PATTERN)
SHORT_ID_RE = re.compile(SHORT_ID_PATTERN)
