"""No record can stop a stream-ops worker: unit tests of `route_record`, and a fuzz run on the real stack.

The fuzz test writes ~5,000 malformed records of ~90 kinds (`tests/fuzz_records.py`) and ~1,000
valid groups, shuffled, into the four partitions of a team's rollouts topic, with one real worker
(a subprocess) reading it. Then: the worker is still up, its committed offsets reach the true end
of every partition, every input (partition, offset) comes out exactly once (a dead letter for each
malformed record, an experience with re-computed rewards and advantages for each valid group),
and SIGTERM stops it cleanly within 15 s. A failure names the kinds that went wrong.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

import fuzz_records
from fuzz_records import HUGE_KINDS, MIB, TEAM, malformed_kinds, pack, valid_group
from streamrft.config import KafkaConfig, RunConfig
from streamrft.infra.kafka import (committed_offsets, ensure_topics, flush_or_raise, make_consumer, make_producer,
                                   partition_ends, run_topics)
from streamrft.schemas import DeadLetter, ExperienceGroup, RolloutGroup, decode, topic_name
from streamrft.stream_ops.app import DEAD_LETTER_MAX_BYTES, route_record
from streamrft.stream_ops.scoring import build_scorer

MALFORMED = 5000
VALID = 1000
SEED = int(os.environ.get("FUZZ_SEED", "20261122"))
REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]


def stream_ops_config(namespace: str, kafka, out: Path) -> dict:
    return {
        "namespace": namespace, "output_dir": str(out), "model": {"path": "unused"},
        "stack": {"embedded": False}, "kafka": kafka.model_dump(), "explorer": {"team": TEAM},
        "stream_ops": {"rewards": [{"name": "exact_match"},
                                   {"import_path": "fuzz_records:picky_reward", "weight": 2.0}],
                       "drop_zero_variance": True, "priority": "reward_std"},
    }


# ---- route_record alone: whatever fails on one record makes it a dead letter ----

def fuzz_scorer():
    return build_scorer(RunConfig.model_validate(stream_ops_config("ns", KafkaConfig(), Path("unused"))))


def _route(scorer, value, key=b"k", **kw):
    return route_record(scorer, "ns", value, key, f"ns.rollouts.{TEAM}", 3, 41, **kw)


def test_any_exception_in_any_stage_is_a_dead_letter():
    rng = random.Random(0)
    good = pack(valid_group(rng))

    def scorer_raising(group):
        raise LookupError("a bug in a scorer, not a ScoringError")

    def scorer_unencodable(group):
        exp = fuzz_scorer()(group)
        exp.task.metadata["oops"] = {1, 2}  # a set: pydantic keeps it, msgpack cannot pack it
        return exp

    long_name = type("Long" * 100, (Exception,), {})  # longer than DeadLetter.error_type may be

    def scorer_long_name(group):
        raise long_name("x")

    for scorer, error_type, stage in ((scorer_raising, "LookupError", "scoring"),
                                      (scorer_unencodable, "TypeError", "encoding the experience"),
                                      (scorer_long_name, "Long" * 64, "scoring")):
        out = _route(scorer, good)
        dead = decode(out.value)
        assert out.kind == "dead_letter" and isinstance(dead, DeadLetter) and out.key == b"k"
        assert dead.error_type == error_type and dead.reason.startswith(error_type)
        assert f" while {stage}: " in dead.reason
        assert (dead.source_topic, dead.source_partition, dead.source_offset) == (f"ns.rollouts.{TEAM}", 3, 41)
        assert dead.value == good and dead.key == b"k" and dead.role == "stream_ops"

    scorer = fuzz_scorer()
    out = _route(scorer, good, max_output_bytes=len(good) // 2)  # a valid group whose experience cannot be sent
    assert out.kind == "dead_letter" and decode(out.value).error_type == "OutputTooLarge"
    assert _route(scorer, good).kind == "experience"

    # the record that once crashed the agent: a model_version too big for msgpack once decoded as an int
    group = valid_group(rng)
    group["trajectories"][0]["model_version"] = fuzz_records.HUGE_INT_TEXT
    out = _route(scorer, pack(group))
    assert out.kind == "dead_letter" and decode(out.value).value == pack(group)

    out = _route(scorer, None, key=None)  # a tombstone
    dead = decode(out.value)
    assert out.kind == "dead_letter" and out.key is None and dead.value == b"" and "tombstone" in dead.reason


def test_user_reward_failures_are_dead_letters_naming_the_term():
    scorer = fuzz_scorer()
    rng = random.Random(1)
    expected = {fuzz_records.CUE_RAISE: "KeyError", fuzz_records.CUE_NAN: "ScoringError",
                fuzz_records.CUE_NOT_NUMBER: "ValueError", fuzz_records.CUE_OVERFLOW: "ScoringError",
                fuzz_records.CUE_UNPRINTABLE: "UnprintableError"}
    for cue, error_type in expected.items():
        group = valid_group(rng, responses=["4", cue])
        dead = decode(_route(scorer, pack(group)).value)
        assert isinstance(dead, DeadLetter) and dead.error_type == error_type, (cue, dead.reason)
    dead = decode(_route(scorer, pack(valid_group(rng, responses=["4", fuzz_records.CUE_OVERFLOW]))).value)
    assert "overflow" in dead.reason


def test_dead_letter_of_a_huge_record_is_truncated_and_says_so():
    scorer = fuzz_scorer()
    value, key = b"\x01" * (3 * MIB + 5), b"k" * (2 * MIB)
    out = _route(scorer, value, key=key)
    dead = decode(out.value)
    assert dead.value == value[:DEAD_LETTER_MAX_BYTES] and dead.key == key[:DEAD_LETTER_MAX_BYTES]
    assert out.key == key[:DEAD_LETTER_MAX_BYTES] and len(out.value) < 2 * DEAD_LETTER_MAX_BYTES + 8192
    assert f"value truncated to {DEAD_LETTER_MAX_BYTES} of {3 * MIB + 5} bytes" in dead.reason
    assert f"key truncated to {DEAD_LETTER_MAX_BYTES} of {2 * MIB} bytes" in dead.reason
    assert f"ns.rollouts.{TEAM}[3]@41" in dead.reason


# ---- the fuzz run ----

def make_records(rng: random.Random) -> list[tuple[str, bytes | None, bytes | None]]:
    """(kind, key, value): MALFORMED malformed records over every kind, VALID groups, one large valid one."""
    kinds = malformed_kinds()
    names = sorted(kinds)
    records = []
    for i in range(MALFORMED - sum(n for _, n in HUGE_KINDS.values())):
        name = names[i % len(names)]
        records.append((name, *kinds[name](rng)))
    for name, (make, count) in HUGE_KINDS.items():
        records += [(name, *make(rng)) for _ in range(count)]
    for _ in range(VALID):
        group = valid_group(rng)
        records.append(("valid", group["group_id"].encode(), pack(group)))
    # larger than faust's producer batch (1 MiB) and one fetch: still an experience
    group = valid_group(rng, responses=["4", "5"], response_tokens=60_000)
    records.append(("valid_large", group["group_id"].encode(), pack(group)))
    rng.shuffle(records)
    return records


def check_dead_letter(dead: DeadLetter, topic: str, p: int, o: int, key: bytes | None,
                      value: bytes | None) -> str | None:
    """None if `dead` is the right dead letter of the record, else what is wrong."""
    if (dead.source_topic, dead.source_partition, dead.source_offset) != (topic, p, o):
        return "wrong source"
    cap = DEAD_LETTER_MAX_BYTES
    if dead.value != (value or b"")[:cap] or dead.key != (key[:cap] if key is not None else None):
        return "wrong original bytes"
    if not dead.reason or not dead.error_type or dead.role != "stream_ops":
        return "no reason"
    if len(value or b"") > DEAD_LETTER_MAX_BYTES and f"of {len(value)} bytes" not in dead.reason:
        return "truncation not stated"
    return None


def check_experience(exp: ExperienceGroup, scorer, value: bytes) -> str | None:
    group = decode(value, RolloutGroup)
    want = scorer(group)
    if want is None:
        return "expected to be filtered"
    if exp.rewards != want.rewards or exp.reward_components != want.reward_components:
        return f"rewards {exp.rewards} != {want.rewards}"
    if exp.advantages != pytest.approx(want.advantages, abs=1e-6) or exp.priority != pytest.approx(want.priority):
        return f"advantages {exp.advantages} != {want.advantages}"
    if exp.trajectories != group.trajectories or exp.task != group.task or exp.group_id != group.group_id:
        return "group content changed"
    return None


def test_fuzz_no_record_stops_the_worker(stack, namespace, tmp_path):
    kafka = stack.kafka
    ensure_topics(kafka, run_topics(kafka, namespace, teams=(TEAM,)))
    topic = topic_name(namespace, "rollouts", TEAM)
    cfg_dict = stream_ops_config(namespace, kafka, tmp_path / "out")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg_dict))
    scorer = build_scorer(RunConfig.model_validate(cfg_dict))
    rng = random.Random(SEED)
    records = make_records(rng)
    kinds = Counter(kind for kind, _, _ in records)
    n_bytes = sum(len(k or b"") + len(v or b"") for _, k, v in records)
    print(f"fuzz seed {SEED}: {len(records)} records ({n_bytes / MIB:.1f} MiB), {len(kinds)} kinds")

    log = tmp_path / "worker.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    with open(log, "ab") as fh:
        worker = subprocess.Popen([sys.executable, "-m", "streamrft.stream_ops.cli_entry", str(config),
                                   "--worker-id", "fuzz"], stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    consumer = make_consumer(kafka, None)
    try:
        started = time.monotonic()
        where: dict[tuple[int, int], int] = {}  # (partition, offset) -> index in records
        producer = make_producer(kafka)
        for i, (_, key, value) in enumerate(records):
            producer.produce(topic, value, key, partition=rng.randrange(kafka.partitions),
                             on_delivery=lambda err, msg, i=i: where.__setitem__((msg.partition(), msg.offset()), i))
        flush_or_raise(producer, 120)
        del producer
        assert len(where) == len(records)
        produced_s = time.monotonic() - started

        experiences, dlq = topic_name(namespace, "experiences"), topic_name(namespace, "dlq")
        consumer.assign([TopicPartition(experiences, p, OFFSET_BEGINNING) for p in range(kafka.partitions)]
                        + [TopicPartition(dlq, 0, OFFSET_BEGINNING)])
        outputs: dict[tuple[int, int], list] = defaultdict(list)
        n_out, last_progress = 0, time.monotonic()
        while n_out < len(records):
            assert worker.poll() is None, f"worker exited with {worker.returncode}; log:\n{log.read_text()[-4000:]}"
            # the worker needs 5-15 s to start and join; a pause this long means a stalled stream
            assert time.monotonic() - last_progress < 45, (f"stalled at {n_out}/{len(records)} outputs; "
                                                            f"log:\n{log.read_text()[-4000:]}")
            for m in consumer.consume(num_messages=1000, timeout=0.5):
                n_out, last_progress = n_out + 1, time.monotonic()
                assert m.error() is None, m.error()
                msg = decode(m.value())
                assert isinstance(msg, (ExperienceGroup, DeadLetter)) and msg.source_topic == topic
                outputs[(msg.source_partition, msg.source_offset)].append(msg)
        processed_s = time.monotonic() - started

        # committed offsets reach the true end of every partition (read, never the reported watermark)
        ends = {e.partition: e.end for e in partition_ends(kafka, topic)}
        assert ends == {p: 1 + max(o for (q, o) in where if q == p) for p in range(kafka.partitions)}
        group_id = f"{namespace}.stream-ops"
        deadline = time.monotonic() + 30
        while (committed := committed_offsets(kafka, group_id, topic, list(ends))) != ends:
            assert time.monotonic() < deadline, f"committed {committed}, ends {ends}"
            time.sleep(0.5)

        # every input exactly once, and the right output for its kind
        problems: dict[str, Counter] = defaultdict(Counter)
        outcome: dict[str, Counter] = defaultdict(Counter)
        example: dict[str, str] = {}
        for (p, o), i in where.items():
            kind, key, value = records[i]
            outs = outputs.pop((p, o), [])
            problem = None
            if len(outs) != 1:
                problem = f"{len(outs)} outputs"
            elif isinstance(outs[0], DeadLetter):
                outcome[kind]["dead_letter"] += 1
                problem = (f"dead-lettered: {outs[0].reason[:200]}" if kind.startswith("valid")
                           else check_dead_letter(outs[0], topic, p, o, key, value))
            else:
                outcome[kind]["experience"] += 1
                problem = (check_experience(outs[0], scorer, value) if kind.startswith("valid")
                           else "scored instead of dead-lettered")
            if problem:
                problems[kind][problem.split(":")[0]] += 1
                example.setdefault(kind, f"{problem} (at {p}@{o})")
        assert not outputs, f"outputs for offsets that were never produced: {sorted(outputs)[:10]}"
        print(f"produced in {produced_s:.1f}s, all {len(records)} out {processed_s:.1f}s after the worker started")
        for kind in sorted(kinds):
            print(f"  {kind:40s} {kinds[kind]:5d}  {dict(outcome[kind])}")
        assert not problems, "kinds handled wrongly:\n" + "\n".join(
            f"  {kind}: {dict(c)}; e.g. {example[kind]}" for kind, c in sorted(problems.items()))
        assert worker.poll() is None, "the worker stopped"
    finally:
        consumer.close()
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            stopping = time.monotonic()
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)
                raise AssertionError(f"worker ignored SIGTERM for 15 s; log:\n{log.read_text()[-3000:]}")
            print(f"SIGTERM -> exit {worker.returncode} in {time.monotonic() - stopping:.1f}s")
    assert worker.returncode == 0, log.read_text()[-3000:]
