"""Models built from values the caller computed, at a fraction of ``model_construct``'s
cost.

``BaseModel.model_construct`` walks every field of the class in Python (aliases,
defaults) on each call: about 6.7 µs for a one-field model on this machine, most of an
MRP compile's per-shard cost at 100,000 shards. :func:`built` sets the instance's state the
way ``model_construct`` ends up setting it, for classes with no aliases, no private
attributes, no ``model_post_init`` and no extra fields, given every field. It checks that
once per class and falls back to ``model_construct`` where a class does not qualify.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

_plain: dict[type[BaseModel], frozenset[str] | None] = {}
_setattr = object.__setattr__


def _fields_if_plain(cls: type[BaseModel]) -> frozenset[str] | None:
    """``cls``'s field names when :func:`built` may set its state directly, else None."""
    if cls in _plain:
        return _plain[cls]
    fields = cls.__pydantic_fields__
    plain = (
        not cls.__pydantic_root_model__
        and not cls.__pydantic_post_init__
        and not cls.__private_attributes__
        and cls.model_config.get("extra") != "allow"
        and all(f.alias is None and f.validation_alias is None for f in fields.values())
    )
    names = frozenset(fields) if plain else None
    _plain[cls] = names
    return names


def built(cls: type[M], **values: Any) -> M:
    """An instance of ``cls`` holding ``values`` (every field, none validated): the same
    instance ``cls.model_construct(**values)`` makes."""
    names = _fields_if_plain(cls)
    if names is None or len(values) != len(names) or not names.issuperset(values):
        return cls.model_construct(**values)
    m = cls.__new__(cls)
    _setattr(m, "__dict__", values)
    _setattr(m, "__pydantic_fields_set__", set(values))
    _setattr(m, "__pydantic_extra__", None)
    _setattr(m, "__pydantic_private__", None)
    return m


__all__ = ["built"]
