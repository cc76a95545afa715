"""Fast construction of openai's response models, exactly as openai builds them.

Chunks and completions are the ``openai`` package's own classes, built without validation exactly
as ``openai.AsyncStream`` builds them (``construct_type``), so they compare equal to openai's,
nested objects included, and keep the unknown fields vendors add. The common shapes take a fast
path that reproduces openai's construction for the values it recognises and hands anything
else to openai's own ``construct_type``. Every protocol's decoder builds its chunks here.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeAlias, cast

import pydantic
import pydantic_core
from openai._models import construct_type
from openai.types.chat import ChatCompletionChunk

__all__ = ["build_chunk"]


# Fast construction.
#
# openai's ``BaseModel.construct`` keeps each field's value as is, except: a model field is
# constructed recursively from a dict, a list of models from a list of dicts, and an Optional
# (union) field is first *validated* by pydantic, falling back to construction. The shapes below
# reproduce that without pydantic for values whose outcome is certain (a str for Optional[str], a
# dict that would pass validation for Optional[Model], ...) and raise _Slow otherwise, so the
# field (or whole object) goes to openai's own code.


_MAX_PLANS = 64  # key layouts remembered per model class


class _Slow(Exception):
    """The fast path cannot vouch for this value; openai's construct_type decides."""


_Convert: TypeAlias = Callable[[Any], Any]
_Field: TypeAlias = pydantic.fields.FieldInfo

# How openai's construct treats a field's value (None always gives the field's default).
_AS_IS = 0  # kept as is whatever it is: str, int, bool, Literal
_TYPED = 1  # Optional[str | int | float | bool | Literal[str...]]: as is when of that exact type
_MODEL = 2  # a model, constructed from a dict
_LIST = 3  # a list of models, each constructed from a dict
_VALIDATED = 4  # other Optional: pydantic validation first, then construction
_GENERAL = 5  # anything else

_new = object.__new__
_slots = pydantic.BaseModel.__dict__
_set_dict = _slots["__dict__"].__set__
_set_private = _slots["__pydantic_private__"].__set__
_set_extra = _slots["__pydantic_extra__"].__set__
_set_fields_set = _slots["__pydantic_fields_set__"].__set__


class _Shape:
    """A model class's fields, classified once, and the two ways openai may build it."""

    __slots__ = ("checks", "cls", "defaults", "fix", "names", "plans", "required", "supported")

    def __init__(self, cls: type[pydantic.BaseModel]) -> None:
        self.cls = cls
        self.supported = _supported(cls)
        fields = cls.model_fields
        self.names = frozenset(fields)
        self.required = frozenset(name for name, f in fields.items() if f.is_required())
        self.defaults: dict[str, Any] = {}
        self.fix: dict[str, tuple[int, Any, _Field, Any]] = {}
        self.checks: dict[str, _Convert] = {}
        # A compiled construct for each key layout seen twice (a stream repeats the same
        # layouts; compiling one seen once, such as a stream's role chunk's, would cost a
        # process's first answer more than it saves). None: seen once.
        self.plans: dict[tuple[str, ...], Callable[[dict[str, Any]], Any] | None] = {}
        for name, field in fields.items():
            default = field.get_default()
            default = None if default is pydantic_core.PydanticUndefined else default
            self.defaults[name] = default
            kind, arg = _construct_kind(field)
            if kind != _AS_IS or default is not None:
                self.fix[name] = (kind, arg, field, default)
            self.checks[name] = _validator(field.annotation, field.metadata)

    def _make(self, values: dict[str, Any], fields_set: set[str], extra: dict[str, Any]) -> Any:
        m = _new(self.cls)
        _set_dict(m, values)
        _set_private(m, None)
        _set_extra(m, extra)
        _set_fields_set(m, fields_set)
        return m

    def construct(self, data: object) -> Any:
        """What ``cls.construct(**data)`` returns, or _Slow."""
        if type(data) is not dict or not self.supported:
            raise _Slow
        layout = tuple(data)
        build = self.plans.get(layout)
        if build is not None:  # the common case: known fields only, in a layout seen before
            return build(data)
        values = self.defaults.copy()
        extra: dict[str, Any] = {}
        if data.keys() <= self.names:
            if layout in self.plans:
                build = self.plans[layout] = self._compile(layout)
                return build(data)
            if len(self.plans) < _MAX_PLANS:
                self.plans[layout] = None
            values.update(data)
            fields_set = set(data)
        else:
            fields_set = set()
            for key, value in data.items():
                if key in self.names:
                    values[key] = value
                    fields_set.add(key)
                elif key == "_fields_set":
                    raise _Slow
                else:
                    extra[key] = value
        plan = [(k, *self.fix[k]) for k in data if k in self.fix]
        return self._make(self._fixed(values, data, plan), fields_set, extra)

    def _compile(self, layout: tuple[str, ...]) -> Callable[[dict[str, Any]], Any]:
        """A straight-line ``construct`` for dicts with exactly these keys in this order (known
        fields only): what ``_fixed`` does, without its loop and dispatch on each field's kind."""
        env: dict[str, Any] = {
            "Slow": _Slow,
            "general": _general,
            "new": _new,
            "cls": self.cls,
            "defaults": self.defaults,
            "set_dict": _set_dict,
            "set_private": _set_private,
            "set_extra": _set_extra,
            "set_fields_set": _set_fields_set,
            "layout": frozenset(layout),
        }
        body = ["def build(data):", "    values = defaults.copy()", "    values.update(data)"]
        for i, key in enumerate(layout):
            if key not in self.fix:
                continue
            kind, arg, field, default = self.fix[key]
            k = repr(key)
            env[f"d{i}"], env[f"f{i}"] = default, field
            body += [f"    v = data[{k}]", "    if v is None:", f"        values[{k}] = d{i}"]
            if kind == _TYPED:
                env[f"t{i}"] = arg
                body += [f"    elif type(v) is not t{i}:"]
                body += [f"        values[{k}] = general(v, f{i})"]
                continue
            if kind == _LIST:
                env[f"c{i}"] = (arg.shape or arg.load()).construct
                call = f"list(map(c{i}, v)) if type(v) is list else general(v, f{i})"
            elif kind == _MODEL:
                env[f"c{i}"] = (arg.shape or arg.load()).construct
                call = f"c{i}(v)"
            elif kind == _VALIDATED:
                env[f"c{i}"] = arg
                call = f"c{i}(v)"
            else:
                call = f"general(v, f{i})"
            body += [
                "    else:",
                "        try:",
                f"            values[{k}] = {call}",
                "        except Slow:",
                f"            values[{k}] = general(v, f{i})",
            ]
        body += [
            "    m = new(cls)",
            "    set_dict(m, values)",
            "    set_private(m, None)",
            "    set_extra(m, {})",
            "    set_fields_set(m, set(layout))",
            "    return m",
        ]
        exec("\n".join(body), env)
        return cast(Callable[[dict[str, Any]], Any], env["build"])

    @staticmethod
    def _fixed(
        values: dict[str, Any],
        data: dict[str, Any],
        plan: list[tuple[str, int, Any, _Field, Any]],
    ) -> dict[str, Any]:
        for key, kind, arg, field, default in plan:
            value = data[key]
            if value is None:
                values[key] = default
            elif kind == _TYPED:
                if type(value) is not arg:
                    values[key] = _general(value, field)
            elif kind == _LIST:
                try:
                    build = (arg.shape or arg.load()).construct
                    values[key] = [build(item) for item in _list(value)]
                except _Slow:
                    values[key] = _general(value, field)
            elif kind == _MODEL:
                try:
                    values[key] = (arg.shape or arg.load()).construct(value)
                except _Slow:
                    values[key] = _general(value, field)
            elif kind == _VALIDATED:
                try:
                    values[key] = arg(value)
                except _Slow:
                    values[key] = _general(value, field)
            elif kind == _GENERAL:
                values[key] = _general(value, field)
        return values

    def validate(self, data: object) -> Any:
        """What pydantic validation of ``data`` as ``cls`` returns, or _Slow if not certain."""
        if type(data) is not dict or not self.supported:
            raise _Slow
        values = self.defaults.copy()
        fields_set: set[str] = set()
        extra: dict[str, Any] = {}
        checks = self.checks
        for key, value in data.items():
            check = checks.get(key)
            if check is None:
                if key[:1] == "_":
                    raise _Slow
                extra[key] = value
            else:
                values[key] = check(value)
            fields_set.add(key)  # validation counts extras as set, construction does not
        if not self.required <= fields_set:
            raise _Slow
        return self._make(values, fields_set, extra)


_SHAPES: dict[type, _Shape] = {}


def _shape(cls: type[pydantic.BaseModel]) -> _Shape:
    shape = _SHAPES.get(cls)
    if shape is None:
        shape = _SHAPES[cls] = _Shape(cls)
    return shape


class _Lazy:
    """A nested model's shape, classified on first use (models may refer to each other)."""

    __slots__ = ("cls", "shape")

    def __init__(self, cls: type[pydantic.BaseModel]) -> None:
        self.cls = cls
        self.shape: _Shape | None = None

    def load(self) -> _Shape:
        self.shape = _shape(self.cls)
        return self.shape

    def validate(self, data: object) -> Any:
        return (self.shape or self.load()).validate(data)


def _supported(cls: type[pydantic.BaseModel]) -> bool:
    if cls.__private_attributes__ or cls.model_config.get("extra") != "allow":
        return False
    for name, field in cls.model_fields.items():
        if field.alias not in (None, name) or field.validation_alias is not None:
            return False
        if field.default_factory is not None:
            return False
    if not _annotates_extras(cls):
        return True  # extras are kept as given: no need to build a deferred model's schema
    core = cls.__pydantic_core_schema__
    fields = core.get("schema", {}) if core.get("type") == "model" else {}
    return not (fields.get("type") == "model-fields" and fields.get("extras_schema"))


def _annotates_extras(cls: type[pydantic.BaseModel]) -> bool:
    """Whether ``cls`` or a base of it below pydantic's ``BaseModel`` annotates
    ``__pydantic_extra__`` (only then may its extras have a type that validation checks).
    Read from the classes' annotations: asking for ``__pydantic_core_schema__`` builds the
    schema of a model that openai defers (``defer_build``), most of a process's first cache
    hit."""
    for base in cls.__mro__:
        if base is pydantic.BaseModel:
            return False
        try:
            annotations = inspect.get_annotations(base)
        except Exception:  # annotations that cannot be evaluated: ask pydantic
            return True
        if "__pydantic_extra__" in annotations:
            return True
    return False


def _general(value: object, field: _Field) -> Any:
    return construct_type(value=value, type_=field.annotation, metadata=field.metadata)


def _list(value: object) -> list[Any]:
    if type(value) is not list:
        raise _Slow
    return cast(list[Any], value)


def _is_model(tp: object) -> bool:
    return isinstance(tp, type) and issubclass(tp, pydantic.BaseModel)


def _optional_arg(tp: object) -> object | None:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if len(args) == 2 and type(None) in args:
            return args[0] if args[1] is type(None) else args[1]
    return None


def _construct_kind(field: _Field) -> tuple[int, Any]:
    tp = field.annotation
    if field.metadata:
        return _GENERAL, None
    if tp in (str, int, bool) or typing.get_origin(tp) is Literal:
        return _AS_IS, None
    if _is_model(tp):
        return _MODEL, _Lazy(cast(type, tp))
    if typing.get_origin(tp) is list:
        args = typing.get_args(tp)
        if len(args) == 1 and _is_model(args[0]):
            return _LIST, _Lazy(args[0])
    inner = _optional_arg(tp)
    if inner in (str, int, float, bool):
        return _TYPED, inner
    if typing.get_origin(inner) is Literal and all(type(a) is str for a in typing.get_args(inner)):
        return _TYPED, str  # validated or not, a str comes back as is
    if inner is not None:
        return _VALIDATED, _validator(tp)
    return _GENERAL, None


def _slow(value: object) -> Any:
    raise _Slow


def _exact(tp: type) -> _Convert:
    def check(value: object) -> Any:
        if type(value) is not tp:
            raise _Slow
        return value

    return check


def _validator(tp: object, metadata: list[Any] | None = None) -> _Convert:
    """A function giving what lax pydantic validation of a value as ``tp`` gives, or raising _Slow.

    It vouches only for certain outcomes: exact JSON types, known literals, and models and lists
    of them built from dicts and lists that would validate.
    """
    if metadata:
        return _slow
    inner = _optional_arg(tp)
    if inner is not None:
        check = _validator(inner)

        def optional(value: object) -> Any:
            return None if value is None else check(value)

        return optional
    if tp in (str, int, float, bool):
        return _exact(cast(type, tp))
    if typing.get_origin(tp) is Literal:
        allowed = typing.get_args(tp)
        if not all(type(a) is str for a in allowed):
            return _slow
        names = frozenset(allowed)

        def literal(value: object) -> Any:
            if type(value) is not str or value not in names:
                raise _Slow
            return value

        return literal
    if _is_model(tp):
        return _Lazy(cast(type, tp)).validate
    if typing.get_origin(tp) is list and len(typing.get_args(tp)) == 1:
        item = _validator(typing.get_args(tp)[0])

        def items(value: object) -> Any:
            return [item(v) for v in _list(value)]

        return items
    return _slow


_CHUNK = _shape(ChatCompletionChunk)


def build_chunk(data: object) -> ChatCompletionChunk:
    """Build a chunk from decoded JSON exactly as openai's ``construct_type`` would, only faster."""
    if type(data) is dict:
        try:
            return cast(ChatCompletionChunk, _CHUNK.construct(data))
        except _Slow:
            pass
    return cast(ChatCompletionChunk, construct_type(type_=ChatCompletionChunk, value=data))
