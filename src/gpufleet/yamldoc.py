"""YAML documents checked by pydantic models, with one clear error per bad input.

Every hand-written file gpufleet reads (the planner's spec, simulated fleet files, validate's
thresholds files, MIG layout files) goes through here: the first problem becomes one
:class:`FieldError` naming the file, the line (when the document came as text), the field path
(``nodes[0].gpus``) and what is wrong, with a did-you-mean for a misspelt key or name. Checks
the models cannot express (a name that must exist elsewhere in the file) raise the same error
through :func:`field_error`. Imports nothing above ``gpufleet.errors``.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ValidationError

from gpufleet.errors import ParseError

__all__ = ["Document", "FieldError", "field_error", "read_text_file", "read_yaml", "validate"]

M = TypeVar("M", bound=BaseModel)
Loc = tuple[int | str, ...]
# Parts pydantic puts in an error's location that are not fields of the document.
_INTERNAL = ("str", "float", "int", "bool", "dict[str,float]", "list[str]")


class FieldError(ParseError):
    """A bad field of a document: ``source:line: field: problem``."""

    def __init__(self, source: str, where: str, problem: str, line: int | None = None) -> None:
        super().__init__(source, where, problem)
        self.line = line
        if line is not None:
            self.args = (f"{source}:{line}: {where}: {problem}",)
            self.message = self.args[0]


class Document:
    """A parsed YAML document and its node tree (for line numbers)."""

    def __init__(self, data: Any, source: str, root: yaml.Node | None = None) -> None:
        self.data = data
        self.source = source
        self.root = root

    def line_of(self, loc: Loc) -> int | None:
        """The 1-based line of the deepest node along ``loc`` (None without a node tree)."""
        node = _walk(self.root, loc)
        return None if node is None else int(node.start_mark.line) + 1

    def key_line(self, loc: Loc) -> int | None:
        """The 1-based line where the key ending ``loc`` is written (for a bad key)."""
        key = _key_node(self.root, loc)
        return None if key is None else int(key.start_mark.line) + 1


def _walk(node: yaml.Node | None, loc: Loc) -> yaml.Node | None:
    """The deepest node along ``loc``; parts not in the document (a union tag) are skipped."""
    for part in loc:
        child = _child(node, part) if node is not None else None
        if child is not None:
            node = child
    return node


def _child(node: yaml.Node, part: int | str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                return value if isinstance(value, yaml.Node) else None
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        item = node.value[part]
        return item if isinstance(item, yaml.Node) else None
    return None


def _key_node(node: yaml.Node | None, loc: Loc) -> yaml.Node | None:
    """The key node of the last part of ``loc`` (where an unknown key is written)."""
    node = _walk(node, loc[:-1])
    if isinstance(node, yaml.MappingNode):
        for key, _value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(loc[-1]):
                return key
    return None


MAX_DOCUMENT_BYTES = 16 * 2**20  # a hand-written file; anything larger is not one
MAX_DEPTH = 64  # nesting of mappings and lists; gpufleet's documents need a handful


def read_text_file(path: Path, what: str = "file") -> str:
    """A hand-written document's text: one clear error (naming the file) for a missing,
    unreadable, oversized or non-UTF-8 (binary) file."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as exc:
        raise ParseError(str(path), what, f"cannot read: {exc.strerror or exc}") from exc
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise ParseError(str(path), what, f"larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(str(path), f"byte {exc.start}", "not UTF-8 text (a binary file?)") from exc


def _depth_ok(node: yaml.Node | None) -> bool:
    """Whether ``node`` nests at most `MAX_DEPTH` levels (iteratively: no recursion; a node
    that aliases make appear many times is walked once)."""
    todo = [(node, 0)] if node is not None else []
    seen: set[int] = set()
    while todo:
        n, depth = todo.pop()
        if depth > MAX_DEPTH:
            return False
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.MappingNode):
            todo.extend((v, depth + 1) for pair in n.value for v in pair)
        elif isinstance(n, yaml.SequenceNode):
            todo.extend((v, depth + 1) for v in n.value)
    return True


def read_yaml(text: str, source: str) -> Document:
    """Parse YAML text; a syntax error names the file and line, nesting deeper than
    `MAX_DEPTH` is refused."""
    try:
        loader = yaml.SafeLoader(text)  # one parse: the node tree (lines), then its data
        try:
            root = loader.get_single_node()
            if not _depth_ok(root):
                raise ParseError(source, "YAML", f"nested deeper than {MAX_DEPTH} levels")
            data = loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "YAML"
        raise ParseError(source, where, f"not valid YAML: {getattr(exc, 'problem', exc)}") from exc
    except RecursionError as exc:  # the composer recurses per level, before the depth check
        raise ParseError(source, "YAML", f"nested deeper than {MAX_DEPTH} levels") from exc
    return Document(data, source, root)


def field_error(doc: Document, loc: Loc, problem: str) -> FieldError:
    """The error for one field of ``doc`` (a check beyond the model's own)."""
    return FieldError(doc.source, path_of(loc), problem, doc.line_of(loc))


def path_of(loc: Loc, union_tags: Mapping[str, Collection[str]] | None = None) -> str:
    """``("nodes", 0, "gpus")`` -> ``nodes[0].gpus``, without pydantic's internal parts."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        container = loc[i - 2] if i >= 2 and isinstance(loc[i - 1], int) else None
        if union_tags and isinstance(container, str) and part in union_tags.get(container, ()):
            continue  # the discriminator tag pydantic inserts right after list[N]
        if part.startswith("function-") or part in _INTERNAL:
            continue
        out += f".{part}" if out else part
    return out or "(top level)"


def field_names(model: type[BaseModel]) -> set[str]:
    """Every field name of ``model`` and of the models its fields hold (for did-you-mean)."""
    seen: set[type[BaseModel]] = set()
    todo = [model]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        for f in m.model_fields.values():
            todo.extend(_models_in(f.annotation))
    return {name for m in seen for name in m.model_fields}


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in get_args(annotation):
        yield from _models_in(arg)


def did_you_mean(name: str, known: Collection[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest known name, or nothing."""
    close = difflib.get_close_matches(name, sorted(known), 1)
    return f" (did you mean {close[0]!r}?)" if close else ""


SHOWN_CHARS = 60  # a bad value is quoted up to this long: a wrong file is not echoed whole


def _shown(value: Any) -> str:
    """``repr(value)``, cut to `SHOWN_CHARS` with an ellipsis."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 4] + "...'"


def _problem(err: Mapping[str, Any], vocabulary: Collection[str]) -> str:
    kind = str(err.get("type", ""))
    ctx = err.get("ctx") or {}
    given = err.get("input")
    if kind == "extra_forbidden":
        key = str(err["loc"][-1])
        return f"unknown field {key!r}" + did_you_mean(key, vocabulary)
    if kind == "missing":
        return "missing required field"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        field = str(ctx.get("discriminator", "kind")).strip("'")
        tags = [t.strip(" '") for t in str(ctx.get("expected_tags", "")).split(",")]
        hint = did_you_mean(str(ctx.get("tag", "")), tags) if kind == "union_tag_invalid" else ""
        return f"{field} must be one of {', '.join(repr(t) for t in tags)}{hint}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"expected a whole number, got {_shown(given)}"
    if kind in ("float_type", "float_parsing"):
        return f"expected a number, got {_shown(given)}"
    if kind in ("bool_type", "bool_parsing"):
        return f"expected true or false, got {_shown(given)}"
    if kind == "string_type":
        return f"expected text, got {_shown(given)}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"expected a mapping, got {_shown(given)}"
    if kind == "list_type":
        return f"expected a list, got {_shown(given)}"
    if kind == "too_short":
        return f"expected at least {ctx.get('min_length')} item(s)"
    bounds = {
        "greater_than_equal": ("must be at least", "ge"),
        "less_than_equal": ("must be at most", "le"),
    }
    if kind in bounds:
        text, key = bounds[kind]
        return f"{text} {ctx.get(key)}, got {_shown(given)}"
    msg = str(err.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
    if given is not None and not isinstance(given, dict | list) and repr(given) not in msg:
        msg = f"{_shown(given)}: {msg}"
    return msg


def validate(
    model: type[M],
    doc: Document | Any,
    source: str = "<document>",
    *,
    prefix: Loc = (),
    exclude: Collection[str] = (),
    union_tags: Mapping[str, Collection[str]] | None = None,
) -> M:
    """``doc`` (a :class:`Document` or parsed data) as ``model``, or one :class:`FieldError`.

    ``prefix`` is where the part to check sits in the file (line numbers and paths then point
    into the whole file), ``exclude`` the keys of that mapping another model checks;
    ``union_tags`` names the discriminator tags pydantic inserts into locations of
    tagged-union lists, so paths leave them out.
    """
    document = doc if isinstance(doc, Document) else Document(doc, source)
    data = document.data
    if prefix:
        data = _at(data, prefix)
    if exclude and isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in exclude}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc.errors(), model, document, prefix, union_tags) from exc


def _at(data: Any, loc: Loc) -> Any:
    for part in loc:
        data = data[part]
    return data


def _first_error(
    errors: Sequence[Any],
    model: type[BaseModel],
    doc: Document,
    prefix: Loc,
    union_tags: Mapping[str, Collection[str]] | None,
) -> FieldError:
    # Unions report every branch; prefer a unit message ("'40 kV' is not a power"), then the
    # deepest location (the branch that got furthest).
    # A misspelt key comes before the "missing" it causes.
    first = max(
        errors,
        key=lambda e: (
            "is not " in str(e.get("msg")),
            e.get("type") == "extra_forbidden",
            len(e["loc"]),
        ),
    )
    raw_loc: Loc = (*prefix, *first["loc"])
    problem = _problem(first, field_names(model))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    key = _key_node(doc.root, raw_loc) if first.get("type") == "extra_forbidden" else None
    line = int(key.start_mark.line) + 1 if key is not None else doc.line_of(raw_loc)
    return FieldError(doc.source, path_of(raw_loc, union_tags), problem + more, line)
