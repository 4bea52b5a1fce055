"""The sandbox a chat template renders in: Jinja's immutable sandbox with every render given a budget of time, loop
items and text, checked at each operator, call, filter, loop item and join that could exceed it."""
from __future__ import annotations

import functools
import json
import math
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range
from jinja2.utils import Namespace

from engine.errors import TemplateError

# A template comes with the model file: it must not hang or exhaust memory however it is written
# (nested range(100000), 'a' * 4000000000, 9 ** 99999999). Every render gets a budget of time, loop items
# and text; operators, calls and filters that could exceed it are checked before they run.
RENDER_SECONDS = 10.0
RANGE_ITEMS = 2_000_000  # range() items per render, all loops together
LOOP_ITEMS = 2_000_000  # items all for loops of a render take, whatever they iterate (nested loops over a string)
MIN_TEXT_CHARS = 1 << 20  # a render may produce this much text, or 4x its messages' text if more
MAX_INT_ARG = 1 << 20  # widths, counts and repeats passed to calls and filters
MAX_INT_BITS = 1 << 16
MAX_STRFTIME_CHARS = 256
WIDE_FORMAT = re.compile(r"[%{][^%{}]*?\d{6,}")  # "%99999999d", "{:>9999999}"
MAX_JSON_INDENT = 16  # tojson's indent repeats on every line at every depth: 10**6 of it made gigabytes
EMITTED_SHARE = 8  # all {{ }} outputs of a render, captured ones included, at most this many times its text budget
UNSAFE_STR_METHODS = frozenset(["translate", "maketrans"])  # a table's values can be any length: no cheap bound
LOOP_FILTER = "_parley_loop_items"
TEXT_FILTER = "_parley_as_text"  # checks a value about to become text (a list of a 1 MB string 10**5 times: 100 GB)
AS_TEXT = frozenset(["string", "pprint", "tojson"])  # filters that make their value text


@dataclass(slots=True)
class Budget:
    """What one render may still spend."""

    max_chars: int
    deadline: float = field(default_factory=lambda: time.monotonic() + RENDER_SECONDS)
    range_items: int = RANGE_ITEMS
    loop_items: int = LOOP_ITEMS
    emitted: int = 0

    @classmethod
    def for_messages(cls, messages: list[dict[str, str]]) -> "Budget":
        text = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
        return cls(max(MIN_TEXT_CHARS, 4 * text))

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateError(f"The chat template ran for more than {RENDER_SECONDS:g} s and was stopped.")

    def check_size(self, n: int, what: str = "text") -> None:
        if n > self.max_chars:
            raise TemplateError(f"The chat template tried to build {what} of {n:,} items and was stopped.")

    def collect(self, chunks) -> str:
        out, size = [], 0
        for chunk in chunks:
            size += len(chunk)
            self.check_size(size)
            self.check_time()
            out.append(chunk)
        return "".join(out)

    def range(self, *args: int) -> range:
        """range(), its items counted when it is made: nested loops exhaust the budget, not the clock."""
        items = safe_range(*args)
        self.range_items -= len(items)
        if self.range_items < 0:
            raise TemplateError(f"The chat template looped over more than {RANGE_ITEMS:,} range() items.")
        self.check_time()
        return items

    def loop(self, items: Any):
        """A for loop's items, counted as they are taken: a loop's body may do nothing another check sees."""
        for item in items:
            self.loop_items -= 1
            if self.loop_items < 0:
                raise TemplateError(f"The chat template's loops took more than {LOOP_ITEMS:,} items.")
            self.check_time()
            yield item

    def emit(self, value: Any) -> Any:
        """An output's text counted, wherever it goes (a {% set %} block, a macro): those are joined out of `collect`'s
        sight."""
        self.emitted += len(value) if isinstance(value, str) else self.as_text(value)
        if self.emitted > EMITTED_SHARE * self.max_chars:
            raise TemplateError(f"The chat template output more than {self.emitted:,} characters and was stopped.")
        return value

    def as_text(self, value: Any) -> int:
        """The characters `value` would take as text, counted up to the budget (a str(), not made): raises past it."""
        size = _text_size(value, self.max_chars)
        self.check_size(size)
        return size


BUDGET: ContextVar[Budget | None] = ContextVar("parley_template_budget", default=None)


def _budget() -> Budget:
    return BUDGET.get() or Budget(MIN_TEXT_CHARS)


def bounded_environment(extensions: list) -> ImmutableSandboxedEnvironment:
    """The sandbox every chat template compiles in (`raise_exception` is the caller's to add)."""
    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=extensions,
                              finalize=lambda value: _budget().emit(value))
    env.globals["strftime_now"] = _strftime_now
    env.globals["range"] = lambda *args: _budget().range(*args)
    env.globals["namespace"] = _BoundedNamespace
    # Jinja's own tojson escapes HTML characters, which templates written for chat do not expect.
    env.filters["tojson"] = _tojson
    env.filters = {name: _bounded_filter(name, fn) for name, fn in env.filters.items()}
    env.filters[LOOP_FILTER] = lambda items: _budget().loop(items)
    env.filters[TEXT_FILTER] = _as_text
    return env


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with operators and calls that could take unbounded time or memory checked."""

    intercepted_binops = frozenset(["*", "**", "+", "%"])

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        """Every for loop's iterable passed through the budget's counter (a filter: a template cannot shadow it)."""
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Filter(loop.iter, LOOP_FILTER, [], [], None, None, lineno=loop.iter.lineno)
        for concat in tree.find_all(nodes.Concat):  # `a ~ b` makes each side text, out of every other check's sight
            concat.nodes = [nodes.Filter(n, TEXT_FILTER, [], [], None, None, lineno=n.lineno) for n in concat.nodes]
        return tree

    @staticmethod
    def concat(parts: Any) -> str:
        """Jinja joins a {% set %} block's or a macro's output here: its size checked before the join allocates it."""
        parts = list(parts)
        _budget().check_size(sum(map(len, parts)))
        return "".join(parts)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, str) and attr in UNSAFE_STR_METHODS:
            return False
        return super().is_safe_attribute(obj, attr, value)

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        _check_binop(operator, left, right, _budget())
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - Jinja's own signature
        _check_args(args, kwargs)
        method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        if isinstance(getattr(method, "__self__", None), str):
            args = _check_str_method(method.__name__, method.__self__, args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        _check_result(result)
        return result


class _BoundedNamespace(Namespace):
    """namespace(): the one mutable value a template has, so the one place text can grow across iterations."""

    def __setitem__(self, name: str, value: Any) -> None:
        _check_result(value)
        _budget().check_time()
        super().__setitem__(name, value)


def _sized(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, list, tuple, dict)) else None


def _check_binop(operator: str, left: Any, right: Any, budget: Budget) -> None:
    budget.check_time()
    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "**" and ints and right > 0 and abs(left) > 1 and right * math.log2(abs(left)) > MAX_INT_BITS:
        raise TemplateError(f"The chat template tried to compute a {right:,}-th power and was stopped.")
    if operator == "*" and ints and left.bit_length() + right.bit_length() > MAX_INT_BITS:
        raise TemplateError("The chat template tried to compute a huge number and was stopped.")
    if operator == "*" and not ints:
        count = right if isinstance(right, int) else left if isinstance(left, int) else None
        size = _sized(left) if isinstance(right, int) else _sized(right)
        if count is not None and size is not None:
            budget.check_size(size * max(count, 0))
    if operator == "+" and _sized(left) is not None and _sized(right) is not None:
        budget.check_size(_sized(left) + _sized(right))
    if operator == "%" and isinstance(left, str):
        _check_format(left)
        budget.check_size(len(left) + _text_size(right, budget.max_chars))


def _check_str_method(name: str, text: str, args: tuple, kwargs: dict) -> tuple:
    """A str method whose result can be far larger than its inputs, its size bounded before it runs; the arguments
    to call it with (join's items made a list: counted once, then joined)."""
    budget = _budget()
    if name in ("format", "format_map"):
        _check_format(text)
        values = [*args, *kwargs.values()] + (list(args[0].values()) if name == "format_map" and args
                                              and isinstance(args[0], dict) else [])
        widest = max((_text_size(v, budget.max_chars) for v in values), default=0)
        budget.check_size(len(text) + text.count("{") * widest)
    elif name == "join" and len(args) == 1:
        args = (list(args[0]),)
        budget.check_size(_joined_size(text, args[0], budget.max_chars))
    elif name == "replace" and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
        count = text.count(args[0]) if args[0] else len(text) + 1
        budget.check_size(len(text) + count * max(len(args[1]) - len(args[0]), 0))
    return args


def _as_text(value: Any) -> Any:
    if not isinstance(value, str):
        _budget().as_text(value)
    return value


def _text_size(value: Any, limit: int) -> int:
    """About the characters str(value) takes (a container's items and their separators), counted until past
    `limit`: a list repeated from one long string holds few items and a great deal of text."""
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, (str, bytes)):
            total += len(item) + 2
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2
            stack.extend(item)
        elif isinstance(item, dict):
            total += 2
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            total += 8
    return total


def _joined_size(separator: str, items: list, limit: int) -> int:
    return _text_size(items, limit) + len(separator) * max(len(items) - 1, 0)


def _check_args(args: tuple, kwargs: dict) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT_ARG:
            raise TemplateError(f"The chat template passed {value:,} to a call and was stopped.")


def _check_format(text: str) -> None:
    if WIDE_FORMAT.search(text):
        raise TemplateError("The chat template used a format width of a million characters or more and was stopped.")


def _check_result(value: Any) -> None:
    size = _sized(value)
    if size is not None:
        _budget().check_size(size)


def _bounded_filter(name: str, fn):
    """A filter whose int arguments and result size are checked (filters bypass the sandbox's call())."""

    passes_context = getattr(fn, "jinja_pass_arg", None) is not None  # then args[0] is Jinja's, not the template's

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        given = args[1:] if passes_context else args  # (value, *arguments)
        _check_args(given[1:], kwargs)
        given = _check_filter(name, given, kwargs)
        result = fn(*args[:len(args) - len(given)], *given, **kwargs)
        _check_result(result)
        return result

    return checked


def _check_filter(name: str, given: tuple, kwargs: dict) -> tuple:
    """A filter whose result can be far larger than its inputs, its size bounded before it runs; the (value,
    *arguments) to call it with (join's items made a list: counted once, then joined)."""
    budget = _budget()
    if name == "replace" and len(given) >= 3 and all(isinstance(a, str) for a in given[:3]) and given[1]:
        budget.check_size(len(given[0]) + given[0].count(given[1]) * len(given[2]))
    if name == "format" and given and isinstance(given[0], str):
        _check_format(given[0])
    if name in AS_TEXT and given:
        budget.as_text(given[0])
    if name == "join" and given:
        given = (list(given[0]), *given[1:])
        separator = given[1] if len(given) > 1 else kwargs.get("d", "")
        budget.check_size(_joined_size(str(separator), given[0], budget.max_chars))
    if name == "indent" and given and isinstance(given[0], str):
        width = given[1] if len(given) > 1 else kwargs.get("width", 4)
        width = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        budget.check_size(len(given[0]) + (given[0].count("\n") + 1) * width)
    return given


def _strftime_now(format: str) -> str:
    if not isinstance(format, str) or len(format) > MAX_STRFTIME_CHARS:
        raise TemplateError(f"strftime_now takes a format of at most {MAX_STRFTIME_CHARS} characters.")
    return datetime.now().strftime(format)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False,
            separators: tuple[str, str] | list[str] | None = None) -> str:
    if isinstance(indent, str) and len(indent) > MAX_JSON_INDENT or isinstance(indent, int) and indent > MAX_JSON_INDENT:
        raise TemplateError(f"tojson takes an indent of at most {MAX_JSON_INDENT} characters.")
    if separators is not None and not (len(separators) == 2 and all(isinstance(p, str) for p in separators)):
        raise TemplateError("tojson's separators are two strings (between items, after keys).")
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys,
                      separators=None if separators is None else tuple(separators))
