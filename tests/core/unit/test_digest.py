import math

import pytest
from pydantic import BaseModel

from keel.digest import canonical_json, digest_bytes, digest_json, is_digest


class M(BaseModel):
    b: int
    a: str


def test_canonical_json_sorts_keys_and_strips_space():
    assert canonical_json({"b": 1, "a": [1, 2]}) == b'{"a":[1,2],"b":1}'


def test_model_and_dict_digest_alike():
    assert digest_json(M(b=1, a="x")) == digest_json({"a": "x", "b": 1})


def test_digest_known_value():
    # BLAKE3 of the empty input, from the BLAKE3 spec's test vectors.
    assert digest_bytes(b"") == (
        "blake3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    )
    assert is_digest(digest_bytes(b"x"))
    assert not is_digest("sha256:00")


def test_nan_refused():
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})
