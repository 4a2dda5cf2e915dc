"""keel.built: the instance model_construct makes, or model_construct itself."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from keel.built import built
from keel.mrp.ir import MapTask
from keel.mrp.normalize import ShardInput


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    a: int
    b: list[str] | None = None


class Aliased(BaseModel):
    a: int = Field(alias="A")


class Private(BaseModel):
    a: int
    _seen: int = PrivateAttr(default=0)


def test_built_is_what_model_construct_makes() -> None:
    for cls, values in [
        (Frozen, {"a": 1, "b": ["x"]}),
        (ShardInput, {"items": ["w", {"k": None}], "files": None, "records": None}),
        (
            MapTask,
            {
                "shard_index": 3,
                "shard_id": "shard-000003",
                "input_digest": "blake3:" + "a" * 64,
                "item_count": 1,
                "operator_ref": "word-count@1.0.0",
                "operator_digest": "blake3:" + "b" * 64,
                "seed": 7,
                "checkpoint_key": "blake3:" + "c" * 64,
                "input_at": (0, 10, 20),
            },
        ),
    ]:
        made, constructed = built(cls, **values), cls.model_construct(**values)
        assert type(made) is cls
        assert made == constructed
        assert made.__dict__ == constructed.__dict__
        assert made.model_fields_set == constructed.model_fields_set
        assert made.model_dump_json() == constructed.model_dump_json()
        assert made.__pydantic_extra__ is None and made.__pydantic_private__ is None


def test_frozen_stays_frozen() -> None:
    made = built(Frozen, a=1, b=None)
    with pytest.raises(ValidationError, match="frozen"):
        made.a = 2  # type: ignore[misc]


def test_classes_it_cannot_build_go_to_model_construct() -> None:
    # Missing a field: model_construct fills its default.
    assert built(Frozen, a=1).b is None
    assert built(Frozen, a=1).model_fields_set == {"a"}
    # An alias, a private attribute: model_construct's own handling.
    assert built(Aliased, A=5).a == 5
    p = built(Private, a=1)
    assert p._seen == 0
