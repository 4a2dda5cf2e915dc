"""Samples, seeds and collection identities: the ids and keys of sample k, the seed each
sample gets, the identity a re-run must match, and the store's side of a resume."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session, sessionmaker

from keel.srl.steps import CollectionIdentity, CollectionInput
from keel.srl.trajectory import (
    MAX_SAMPLE_SEED,
    ModelOutput,
    Sampling,
    StepRecord,
    StepRow,
    episode_id,
    parse_episode_sample,
    sample_seed,
    step_key,
)
from store.srl_steps import get_identity, get_step, insert_step, list_steps, record_identity

DIGEST = "blake3:" + "0" * 64


def test_sample_zero_keeps_the_old_ids_and_others_are_marked() -> None:
    assert episode_id("c1", "t1") == episode_id("c1", "t1", 0) == "srl/c1/t1"
    assert step_key("t1", 2) == step_key("t1", 2, 0) == "t1#2"
    assert episode_id("c1", "t1", 2) == "srl/c1/t1~s2"
    assert step_key("t1", 2, 2) == "t1~s2#2"
    assert parse_episode_sample("srl/c1/t1~s2") == ("c1", "t1", 2)
    assert parse_episode_sample("srl/c1/t1") == ("c1", "t1", 0)
    for bad in ("srl/c1/t1~s0", "srl/c1/t1~s", "srl/c1/t1~s01", "srl/c1/t1~sx"):
        with pytest.raises(ValueError):
            parse_episode_sample(bad)
    with pytest.raises(ValueError):
        step_key("t1", 1, -1)


def test_sample_seeds_are_stable_distinct_and_in_range() -> None:
    seeds = [sample_seed("c1", "t1", k) for k in range(8)]
    assert seeds == [sample_seed("c1", "t1", k) for k in range(8)]
    assert len(set(seeds)) == 8
    assert all(0 <= s <= MAX_SAMPLE_SEED for s in seeds)
    assert sample_seed("c2", "t1", 0) != seeds[0]
    assert sample_seed("c1", "t2", 0) != seeds[0]
    assert sample_seed("c1", "t1", 0, base=1) != seeds[0]


def test_identity_mismatch_names_both_sides() -> None:
    inp = CollectionInput(collection="c1", tasks_digest=DIGEST, source="teacher", model="local")
    first = inp.identity()
    assert first.tasks_digest == DIGEST
    # Another task file, more samples or steps: the same identity (tasks match by id).
    more = inp.model_copy(update={"samples": 3, "max_steps": 5, "tasks_digest": None})
    assert first.mismatch(more.identity()) is None
    other = inp.model_copy(update={"model": "big", "source": "actor"}).identity()
    message = first.mismatch(other)
    assert message is not None
    assert "source 'teacher', model 'local'" in message
    assert "source 'actor', model 'big'" in message
    hotter = first.mismatch(inp.model_copy(update={"temperature": 0.7}).identity())
    assert hotter is not None and "temperature 0.0" in hotter and "temperature 0.7" in hotter


def _row(collection: str, task_id: str, sample: int, seed: int) -> StepRow:
    record = StepRecord(
        task_id=task_id,
        step=1,
        prompt={"messages": []},
        state_before={},
        model_output=ModelOutput(raw="x", finish_reason="stop", prompt_tokens=5),
        sampling=Sampling(sample=sample, seed=seed, temperature=0.0, top_p=1.0, max_tokens=64),
    )
    return StepRow.from_record(
        record, collection=collection, source="teacher", model="m", language="python"
    )


def test_samples_are_rows_of_their_own_and_found_by_key(sm: sessionmaker[Session]) -> None:
    for sample in range(3):
        _, inserted = insert_step(sm, _row("c", "t1", sample, 100 + sample))
        assert inserted
    rows = list_steps(sm, "c")
    assert [(r.step_key, r.sample, r.seed) for r in rows] == [
        ("t1#1", 0, 100),
        ("t1~s1#1", 1, 101),
        ("t1~s2#1", 2, 102),
    ]
    found = get_step(sm, "c", "t1~s1#1")
    assert found is not None and found.seed == 101
    assert get_step(sm, "c", "t1~s3#1") is None


def test_identity_is_recorded_once_and_the_first_wins(sm: sessionmaker[Session]) -> None:
    first = CollectionIdentity(collection="c", source="teacher", model="a", tasks_digest=DIGEST)
    assert get_identity(sm, "c") is None
    assert record_identity(sm, first) == (first, True)
    second = first.model_copy(update={"model": "b"})
    stored, written = record_identity(sm, second)
    assert (stored, written) == (first, False)
    assert get_identity(sm, "c") == first


def test_a_collection_recorded_before_identities_keeps_its_source(
    sm: sessionmaker[Session],
) -> None:
    insert_step(sm, _row("old", "t1", 0, 1))  # a teacher row, no identity kept
    gold = CollectionIdentity(collection="old", source="gold_replay")
    stored, written = record_identity(sm, gold)
    assert not written and stored.source == "teacher"
    assert stored.mismatch(gold) is not None
    assert get_identity(sm, "old") is None
    teacher = CollectionIdentity(collection="old", source="teacher", model="m")
    assert record_identity(sm, teacher) == (teacher, True)
