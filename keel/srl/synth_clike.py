"""The JavaScript, TypeScript and Java template of :mod:`keel.srl.synth` (rename), over a
small lexer that skips strings, comments, template literals and regex literals."""

from __future__ import annotations

import re

from keel.srl.errors import TemplateNotApplicable
from keel.srl.step import Language
from keel.srl.synth_task import SourceFile, SynthTask, _apply, _pick, _task

_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_REGEX_BEFORE = set("(,=:[!&|?{};+-*%<>~^")
_REGEX_KEYWORDS = {"return", "typeof", "case", "do", "else", "in", "of", "void", "yield"}


def c_like_identifiers(text: str, language: Language) -> list[tuple[int, str]]:
    """``(offset, name)`` of every identifier outside strings, comments, the literal parts
    of template literals and (JavaScript/TypeScript) regex literals; the code inside a
    template literal's ``${…}`` is lexed like any other code.

    Raises :class:`TemplateNotApplicable` on an unterminated string, comment or literal.
    """
    out: list[tuple[int, str]] = []
    end = _lex(text, 0, language, out, in_substitution=False)
    if end != len(text):
        raise TemplateNotApplicable("unbalanced braces")
    return out


def _after_comment(text: str, i: int) -> int:
    """Past the ``//`` or ``/*`` comment at ``i``."""
    if text.startswith("//", i):
        end = text.find("\n", i)
        return len(text) if end < 0 else end
    end = text.find("*/", i + 2)
    if end < 0:
        raise TemplateNotApplicable("unterminated comment")
    return end + 2


def _after_template(text: str, i: int, language: Language, out: list[tuple[int, str]]) -> int:
    """Past the template literal at ``i``, lexing the code of each ``${…}`` into ``out``."""
    n = len(text)
    j = i + 1
    while j < n and text[j] != "`":
        if text[j] == "\\":
            j += 2
        elif text.startswith("${", j):
            j = _lex(text, j + 2, language, out, in_substitution=True)
        else:
            j += 1
    if j >= n:
        raise TemplateNotApplicable("unterminated template literal")
    return j + 1


def _after_string(text: str, i: int) -> int:
    """Past the one-line string quoted by ``text[i]``."""
    n, quote = len(text), text[i]
    j = i + 1
    while j < n and text[j] != quote:
        if text[j] == "\\":
            j += 1
        elif text[j] == "\n":
            raise TemplateNotApplicable("unterminated string")
        j += 1
    if j >= n:
        raise TemplateNotApplicable("unterminated string")
    return j + 1


def _after_regex(text: str, i: int) -> int:
    """Past the regex literal at ``i`` and its flags."""
    n = len(text)
    j, in_class = i + 1, False
    while j < n and (in_class or text[j] != "/"):
        if text[j] == "\\":
            j += 1
        elif text[j] == "[":
            in_class = True
        elif text[j] == "]":
            in_class = False
        elif text[j] == "\n":
            raise TemplateNotApplicable("unterminated regex literal")
        j += 1
    i = j + 1
    while i < n and text[i].isalpha():
        i += 1
    return i


def _after_text_block(text: str, i: int) -> int:
    """Past the Java text block at ``i``."""
    end = text.find('"""', i + 3)
    if end < 0:
        raise TemplateNotApplicable("unterminated text block")
    return end + 3


def _lex(
    text: str, i: int, language: Language, out: list[tuple[int, str]], in_substitution: bool
) -> int:
    """Lex from ``i``; inside a ``${…}`` stop after its closing brace and return there."""
    n = len(text)
    depth = 0
    last_sig = ""  # the last significant token, to tell a regex from a division
    js = language in ("javascript", "typescript")
    while i < n:
        ch = text[i]
        if ch in " \t\r\n":
            i += 1
        elif text.startswith("//", i) or text.startswith("/*", i):
            i = _after_comment(text, i)
        elif language == "java" and text.startswith('"""', i):
            i, last_sig = _after_text_block(text, i), "str"
        elif js and ch == "`":
            i, last_sig = _after_template(text, i, language, out), "str"
        elif ch in "\"'":
            i, last_sig = _after_string(text, i), "str"
        elif (
            js
            and ch == "/"
            and (not last_sig or last_sig in _REGEX_BEFORE or last_sig in _REGEX_KEYWORDS)
        ):
            i, last_sig = _after_regex(text, i), "regex"
        elif ch == "{":
            depth += 1
            last_sig = ch
            i += 1
        elif ch == "}":
            if depth == 0 and in_substitution:
                return i + 1
            if depth == 0:
                raise TemplateNotApplicable("unbalanced braces")
            depth -= 1
            last_sig = ch
            i += 1
        elif match := _IDENT.match(text, i):
            out.append((i, match.group()))
            last_sig = match.group()
            i = match.end()
        elif ch.isdigit():
            while i < n and (text[i].isalnum() or text[i] in "._"):
                i += 1
            last_sig = "num"
        else:
            last_sig = ch
            i += 1
    if in_substitution:
        raise TemplateNotApplicable("unterminated template substitution")
    return i


_JS_FUNCTION = re.compile(
    r"\bfunction\s*\*?\s*([A-Za-z_$][\w$]*)\s*\("
    r"|\b(?:const|let|var)\s+([A-Za-z_$][\w$]*)\s*=\s*(?:async\s+)?"
    r"(?:function\b|\([^()]*\)\s*=>|[A-Za-z_$][\w$]*\s*=>)"
)
# Reserved words of JavaScript, TypeScript and Java that a declaration regex can catch.
_RESERVED = frozenset(
    [
        "break",
        "case",
        "catch",
        "class",
        "const",
        "continue",
        "debugger",
        "default",
        "delete",
        "do",
        "else",
        "enum",
        "export",
        "extends",
        "false",
        "finally",
        "for",
        "function",
        "if",
        "import",
        "in",
        "instanceof",
        "new",
        "null",
        "return",
        "super",
        "switch",
        "this",
        "throw",
        "true",
        "try",
        "typeof",
        "var",
        "void",
        "while",
        "with",
        "yield",
        "let",
        "static",
        "implements",
        "interface",
        "package",
        "private",
        "protected",
        "public",
        "await",
        "async",
        "abstract",
        "boolean",
        "byte",
        "char",
        "double",
        "final",
        "float",
        "goto",
        "int",
        "long",
        "native",
        "short",
        "synchronized",
        "throws",
        "transient",
        "volatile",
        "assert",
    ]
)
_JAVA_METHOD = re.compile(
    r"\b(?:public|protected|private|static|final|synchronized|abstract)\s[^;{}()=]*?"
    r"\b([a-z][A-Za-z0-9_]*)\s*\("
)


def c_like_rename(source: SourceFile, seed: int) -> SynthTask:
    """Rename a function (JavaScript/TypeScript ``function f``) or method (Java) everywhere.

    ast-grep's pattern ``f`` matches ``identifier`` nodes. In JavaScript and TypeScript a
    property (``o.f``, ``{f: 1}``, ``{f}``) is a different node kind, so a name used that
    way anywhere makes the file not applicable; Java's field accesses and method names are
    plain identifiers, renamed like every other use.
    """
    text = source.text
    idents = c_like_identifiers(text, source.language)
    names = {name for _, name in idents}
    decl = _JAVA_METHOD if source.language == "java" else _JS_FUNCTION
    candidates = []
    declared = {next(g for g in m.groups() if g) for m in decl.finditer(text)}
    for name in declared:
        if len(name) < 3 or f"{name}Renamed" in names or name in _RESERVED:
            continue
        uses = [pos for pos, ident in idents if ident == name]
        if not uses:
            continue
        if source.language != "java" and any(_js_property_like(text, pos, name) for pos in uses):
            continue
        candidates.append(name)
    old = _pick(candidates, seed)
    new = f"{old}Renamed"
    edits = [(pos, pos + len(old), new) for pos, ident in idents if ident == old]
    return _task(
        source,
        "rename",
        seed,
        f"Rename `{old}` to `{new}`, its declaration and every use; the old name is being retired.",
        old,
        new,
        _apply(text, edits),
    )


def _js_property_like(text: str, pos: int, name: str) -> bool:
    before = text[:pos].rstrip()
    after = text[pos + len(name) :].lstrip()
    if before.endswith((".", "?.")) or after.startswith(":"):
        return True
    # {name} or {a, name} shorthand properties and class members "name() {".
    return before.endswith(("{", ",")) and after.startswith(("}", ","))
