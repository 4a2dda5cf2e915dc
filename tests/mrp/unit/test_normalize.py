"""Seeds, sharding, globs and the numeric policy: pure functions that must not drift."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keel.digest import digest_bytes
from keel.mrp.normalize import (
    FileRef,
    ShardInput,
    canonical_sorted,
    decimal_mean,
    decimal_mul,
    decimal_sum,
    derive_job_seed,
    derive_seed,
    float_mean,
    float_sum,
    glob_regex,
    in_shard_order,
    inputs_digest_of,
    make_shards,
    quantize,
    shard_seed,
    to_decimal,
)

# No example database on disk, and few enough examples to stay well under a second each.
FAST = settings(max_examples=150, database=None, deadline=None)

ZERO_DIGEST = "blake3:" + "0" * 64
OPS = {"map": "tokens-count@1.0.0", "reduce": "sum-counts@1.0.0", "produce": "json-writer@1.0.0"}

# --- seeds -----------------------------------------------------------------------------


def test_seeds_are_pinned():
    # Golden values: a change here changes every seed and checkpoint key of every job, so
    # it must be deliberate (a new SEED_CONTEXT), never a refactoring accident.
    assert derive_job_seed("0.1", "wordcount-demo", ZERO_DIGEST, OPS) == 8629428834272406378
    assert derive_seed(12345, "reduce") == 6292786750078990784
    assert shard_seed(12345, "blake3:" + "1" * 64) == 8325627425522765962


def test_job_seed_depends_on_each_input_and_not_on_mapping_order():
    base = derive_job_seed("0.1", "j", ZERO_DIGEST, OPS)
    assert derive_job_seed("0.1", "j", ZERO_DIGEST, dict(reversed(list(OPS.items())))) == base
    variants = [
        derive_job_seed("0.2", "j", ZERO_DIGEST, OPS),
        derive_job_seed("0.1", "k", ZERO_DIGEST, OPS),
        derive_job_seed("0.1", "j", "blake3:" + "f" * 64, OPS),
        derive_job_seed("0.1", "j", ZERO_DIGEST, {**OPS, "map": "tokens-count@1.0.1"}),
    ]
    assert base not in variants and len(set(variants)) == len(variants)


@FAST
@given(st.integers(min_value=0, max_value=2**63 - 1), st.text(max_size=40))
def test_derived_seeds_fit_a_signed_64_bit_integer(parent: int, label: str):
    seed = derive_seed(parent, label)
    assert 0 <= seed < 2**63
    assert seed == derive_seed(parent, label)


# --- shards and inputs -------------------------------------------------------------------


@FAST
@given(st.lists(st.integers(), min_size=1, max_size=60), st.integers(min_value=1, max_value=10))
def test_shards_cover_items_in_order(items: list[int], per_shard: int):
    shards = make_shards(items, per_shard)
    assert [s.index for s in shards] == list(range(math.ceil(len(items) / per_shard)))
    assert [x for s in shards for x in (s.input.items or [])] == items
    assert all(s.input.item_count == per_shard for s in shards[:-1])
    assert all(s.input_digest == s.input.digest() for s in shards)


def test_shard_input_digest_is_canonical_json():
    si = ShardInput(items=[{"b": 1, "a": [2]}])
    assert si.canonical() == {"items": [{"b": 1, "a": [2]}]}
    assert si.digest() == digest_bytes(b'{"items":[{"a":[2],"b":1}]}')
    with pytest.raises(ValueError):
        ShardInput()


def test_file_shards_hold_file_refs():
    files = [FileRef(path=f"d/{i}.jsonl", digest=ZERO_DIGEST, size_bytes=i) for i in range(3)]
    shards = make_shards(files, 2)
    assert [s.input.item_count for s in shards] == [2, 1]
    assert shards[1].input.files == [files[2]]
    assert shards[0].input.items is None


def test_inputs_digest_ignores_sharding_but_not_order():
    assert inputs_digest_of([1, 2, 3]) == inputs_digest_of([1, 2, 3])
    assert inputs_digest_of([1, 2, 3]) != inputs_digest_of([3, 2, 1])
    assert inputs_digest_of([{"a": 1, "b": 2}]) == inputs_digest_of([{"b": 2, "a": 1}])


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("data/*.jsonl", ["data/a.jsonl"], ["data/x/a.jsonl", "data/a.json", "xdata/a.jsonl"]),
        ("data/**/*.jsonl", ["data/a.jsonl", "data/x/y/a.jsonl"], ["other/a.jsonl"]),
        ("**", ["a", "a/b/c"], []),
        ("logs/day-??.txt", ["logs/day-01.txt"], ["logs/day-1.txt", "logs/day-001.txt"]),
        ("[ab].txt", ["a.txt", "b.txt"], ["c.txt"]),
        ("x[/]y", [], ["x/y"]),
        ("[!ab].txt", ["c.txt"], ["a.txt", "/.txt"]),
        ("a+b (1).txt", ["a+b (1).txt"], ["aab (1).txt"]),
    ],
)
def test_glob_semantics(pattern: str, yes: list[str], no: list[str]):
    rx = glob_regex(pattern)
    assert all(rx.match(p) for p in yes)
    assert not any(rx.match(p) for p in no)


# --- numeric policy ----------------------------------------------------------------------

amounts = st.decimals(
    min_value=Decimal("-1e12"), max_value=Decimal("1e12"), places=6, allow_nan=False
)
wild_decimals = st.decimals(allow_nan=False, allow_infinity=False)
finite_floats = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300)


@FAST
@given(st.lists(wild_decimals, max_size=40), st.randoms(use_true_random=False))
def test_decimal_sum_does_not_depend_on_order(values: list[Decimal], rnd):
    shuffled = list(values)
    rnd.shuffle(shuffled)
    a, b = decimal_sum(values), decimal_sum(shuffled)
    # Equal as text, not just as numbers: the digest of a reduced output sees the text.
    assert str(a) == str(b)


@FAST
@given(st.lists(amounts, min_size=1, max_size=40), st.randoms(use_true_random=False))
def test_decimal_sum_and_mean_of_amounts_are_exact(values: list[Decimal], rnd):
    shuffled = list(values)
    rnd.shuffle(shuffled)
    exact = sum((Fraction(v) for v in values), Fraction(0))
    assert Fraction(decimal_sum(shuffled)) == exact
    assert str(decimal_mean(values)) == str(decimal_mean(shuffled))


@FAST
@given(st.lists(finite_floats, max_size=40), st.randoms(use_true_random=False))
def test_float_sum_is_exactly_rounded_and_order_free(values: list[float], rnd):
    shuffled = list(values)
    rnd.shuffle(shuffled)
    total = float_sum(values)
    assert total == float_sum(shuffled)
    assert math.copysign(1, total) == math.copysign(1, float_sum(shuffled))
    assert total == float(sum((Fraction(v) for v in values), Fraction(0)))


def test_naive_float_sum_would_depend_on_order():
    # Why the policy exists: the builtin sum of the same numbers differs by order.
    values = [1e16, 1.0, -1e16, 1.0]
    assert sum(values) != sum(sorted(values))
    assert float_sum(values) == float_sum(sorted(values)) == 2.0


def test_float_mean_and_zero_sign():
    assert float_mean([0.5, 0.25, 0.75]) == 0.5
    assert math.copysign(1, float_sum([-0.0, -0.0])) == 1
    assert float_sum([]) == 0.0
    with pytest.raises(ValueError):
        float_mean([])
    with pytest.raises(ValueError):
        float_sum([1.0, math.inf])
    with pytest.raises(TypeError):
        float_sum([True])  # type: ignore[list-item]


def test_to_decimal_reads_floats_by_their_shortest_repr():
    assert to_decimal(0.1) == Decimal("0.1")
    assert to_decimal("2.50") == Decimal("2.50")
    assert to_decimal(7) == Decimal(7)
    for bad in (math.nan, "NaN", "Infinity", "abc"):
        with pytest.raises(ValueError):
            to_decimal(bad)
    with pytest.raises(TypeError):
        to_decimal(True)


def test_fixed_context_rounds_half_even_at_34_digits():
    third = decimal_mean([1, 0, 0])
    assert str(third) == "0." + "3" * 34
    assert quantize("2.5", 0) == Decimal(2) and quantize("3.5", 0) == Decimal(4)
    assert str(quantize("1.23456789", 6)) == "1.234568"
    assert decimal_mul("0.1", 3) == Decimal("0.3")
    with pytest.raises(ValueError):
        decimal_mean([])


def test_in_shard_order_needs_every_shard_once():
    assert in_shard_order({2: "c", 0: "a", 1: "b"}, 3) == ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"missing \[1\]"):
        in_shard_order({0: "a", 2: "c"}, 3)
    with pytest.raises(ValueError, match=r"extra \[3\]"):
        in_shard_order({0: "a", 1: "b", 2: "c", 3: "d"}, 3)


@FAST
@given(st.lists(st.dictionaries(st.text(max_size=3), st.integers(), max_size=3), max_size=10))
def test_canonical_sorted_is_a_function_of_the_multiset(values: list[dict[str, int]]):
    assert canonical_sorted(values) == canonical_sorted(list(reversed(values)))
