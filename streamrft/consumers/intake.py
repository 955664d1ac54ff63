"""The trainer's intake: records off the experiences topic into batches.

`Intake.collect` takes `batch_groups` admitted groups, oldest weights first across partitions
(`oldest_head`), each record decoded strictly once; anything wrong with one record (decoding, a
token the model cannot take, a non-finite value) makes it a dead letter, and a group dropped stale
or dead-lettered is announced on `<ns>.admission` for the explorers' admission control. Where it
reads from: the checkpoint's offsets, never the group's committed ones (`_on_assign`); when
replaying another run's log, `trainer.replay`'s range (to the log's end fixed at start at most),
from its experiences topic or its rollouts topic, scored again with this config (`scorer`).
A mixin of `consumers.trainer.Trainer`, which holds the state it reads and writes.
"""
from __future__ import annotations

import logging
import math

from confluent_kafka import KafkaException

from streamrft.consumers.admission import Counts, admit_trajectories, oldest_head
from streamrft.infra.kafka import consume_ready
from streamrft.infra.offset_gaps import assign_guarded, take_contiguous
from streamrft.schemas import DeadLetter, ExperienceGroup, GroupDropped, RolloutGroup, decode, encode, topic_name

log = logging.getLogger(__name__)

PENDING_TOP_UP = 256  # fetched records below which the trainer fetches more before taking one


class Intake:
    def _start_replay(self) -> None:
        """Fix the replayed range now: its end (the log's end at start-up at most) and, on a fresh
        run, each partition's start; a partition outside `trainer.replay.partitions` is skipped."""
        from streamrft.infra.kafka import partition_ends

        rp = self.replay
        ends = partition_ends(self.cfg.kafka, self.topic)
        key = f"{self.topic}:{{}}".format
        log_end = {e.partition: e.end for e in ends}
        starts = {e.partition: max(e.start, rp.from_offset) for e in ends}
        stops = {p: end if rp.to_offset is None else min(end, rp.to_offset) for p, end in log_end.items()}
        # a time range is applied record by record (`_outside_time`), not by offsets_for_times: the
        # embedded broker's ListOffsets is not to be trusted (INFRA-NOTES), and timestamps are in every record
        if rp.partitions is not None:
            starts = {p: rp.partitions[p][0] if p in rp.partitions else 0 for p in log_end}
            stops = {p: min(rp.partitions[p][1], end) if p in rp.partitions else 0 for p, end in log_end.items()}
        self.replay_end = {key(p): stops[p] for p in log_end}
        if not self.next_offsets:  # resumed: the checkpoint knows where we are
            self.next_offsets = {key(p): min(starts[p], stops[p]) for p in log_end}
            self.position = dict(self.next_offsets)

    def _past_end(self, msg) -> bool:
        return self.replay_end is not None and msg.offset() >= self.replay_end.get(f"{msg.topic()}:{msg.partition()}", 0)

    def _outside_time(self, msg) -> bool:
        """Before `from_timestamp_ms`, or at/after `to_timestamp_ms` (which also ends its partition)."""
        if not self.replay or (self.replay.from_timestamp_ms is None and self.replay.to_timestamp_ms is None):
            return False
        ts = msg.timestamp()[1]
        if self.replay.to_timestamp_ms is not None and ts >= self.replay.to_timestamp_ms:
            key = f"{msg.topic()}:{msg.partition()}"
            self.replay_end[key] = min(self.replay_end.get(key, 0), msg.offset())
            return True
        return self.replay.from_timestamp_ms is not None and ts < self.replay.from_timestamp_ms

    def _replay_done(self) -> bool:
        return self.replay_end is not None and not any(not self._past_end(m) for m in self.pending) and all(
            self.position.get(k, 0) >= end for k, end in self.replay_end.items())

    def _on_assign(self, consumer, partitions):
        # the checkpoint (and what this process read since), not the group's committed offset,
        # is the authority on where to resume; what was fetched before the rebalance is fetched
        # again from there
        assigned = {(tp.topic, tp.partition) for tp in partitions}
        self.pending = [m for m in self.pending if (m.topic(), m.partition()) not in assigned]
        self._decoded.clear()
        for tp in partitions:
            key = f"{tp.topic}:{tp.partition}"
            if key in self.position:
                tp.offset = self.position[key]
        assign_guarded(consumer, self.offset_gaps, partitions)

    def _poll(self, timeout: float) -> None:
        """Fetch records into `pending`. Consume errors are logged (librdkafka recovers from them
        by itself, e.g. while a broker restarts) and fatal ones raised."""
        # never past a record the broker has not listed yet (`infra/offset_gaps.py`)
        for m in take_contiguous(self.consumer, self.offset_gaps, consume_ready(self.consumer, 64, timeout)):
            err = m.error()
            if err is None:
                self.pending.append(m)
            elif err.fatal():
                raise KafkaException(err)
            else:
                log.warning("consume error on %s: %s", m.topic() or self.topic, err)

    # ---- data -----------------------------------------------------------------------------
    def _dead_letter(self, msg, err: Exception, counts: Counts) -> None:
        # durable before the checkpoint that moves past `msg`: publish() flushes first
        log.warning("dead letter %s[%d]@%d: %s: %s", msg.topic(), msg.partition(), msg.offset(), type(err).__name__, err)
        dl = DeadLetter(reason=str(err) or type(err).__name__, error_type=type(err).__name__, source_topic=msg.topic(),
                        source_partition=msg.partition(), source_offset=msg.offset(), role="trainer",
                        key=msg.key(), value=msg.value() or b"")
        self.producer.produce(topic_name(self.cfg.namespace, "dlq"), key=msg.key(), value=encode(dl))
        counts.dead_lettered += 1
        self._dropped(GroupDropped.of_record(msg.key(), msg.topic(), msg.partition(), msg.offset(), "dead_letter",
                                             "trainer"))

    def _dropped(self, drop: GroupDropped) -> None:
        """Tell explorers' admission control that a group will never be trained (replay: no explorers).
        Sent at once; the flush before each checkpoint makes it durable before the offsets move past it."""
        if not self.replay:
            self.producer.produce(topic_name(self.cfg.namespace, "admission"), key=drop.group_id.encode(),
                                  value=encode(drop))

    def _check_fits_model(self, eg: ExperienceGroup) -> None:
        """Data the model cannot take becomes a dead letter instead of crashing the step."""
        vocab = self.model.get_input_embeddings().num_embeddings
        max_len = getattr(self.model.config, "max_position_embeddings", None)
        for t in eg.trajectories:
            top = max(t.prompt_ids + t.response_ids)
            if top >= vocab:
                raise ValueError(f"trajectory {t.traj_id}: token id {top} >= the model's vocabulary size {vocab}")
            if max_len and len(t.prompt_ids) + len(t.response_ids) > max_len:
                raise ValueError(f"trajectory {t.traj_id}: {len(t.prompt_ids) + len(t.response_ids)} tokens "
                                 f"> the model's {max_len} positions")
        if not all(math.isfinite(x) for x in (*eg.rewards, *eg.advantages)):
            raise ValueError(f"group {eg.group_id}: non-finite reward or advantage")

    def _decoded_at(self, i: int) -> ExperienceGroup | Exception:
        """pending[i] decoded, once (what decoding raised is kept: the record becomes a dead letter)."""
        m = self.pending[i]
        at = (m.topic(), m.partition(), m.offset())
        if at not in self._decoded:
            try:
                self._decoded[at] = self._decode_value(m.value())
            except Exception as e:
                self._decoded[at] = e
        return self._decoded[at]

    def _decode_value(self, value: bytes) -> ExperienceGroup | None:
        """An experiences record, or a rollouts record scored with this config's rewards (None: the
        scorer filtered it, e.g. zero variance)."""
        if self.scorer is None:
            return decode(value, ExperienceGroup)
        return self.scorer(decode(value, RolloutGroup))

    def read_groups(self, locations: list[tuple[str, int, int]]) -> dict[tuple, ExperienceGroup]:
        """The groups at these log locations, read again by offset (the replay buffer's restore)."""
        from streamrft.infra.kafka import read_at

        out = {}
        for at, value in read_at(self.cfg.kafka, locations).items():
            try:
                eg = self._decode_value(value)
            except Exception as e:  # it was trained once, so this is unexpected; skip it, do not crash
                log.warning("replay buffer: %s does not decode any more: %s", at, e)
                continue
            if eg is not None:
                out[at] = eg
        return out

    def _take(self):
        """(record, its ExperienceGroup or decoding error): of the pending records, the next to train
        on (`oldest_head`: the oldest weights first across partitions)."""
        def version_of(i: int) -> int:
            eg = self._decoded_at(i)
            return -1 if eg is None or isinstance(eg, Exception) else min(t.model_version for t in eg.trajectories)

        i = oldest_head([(m.topic(), m.partition()) for m in self.pending], version_of)
        eg = self._decoded_at(i)
        msg = self.pending.pop(i)
        del self._decoded[(msg.topic(), msg.partition(), msg.offset())]
        return msg, eg

    def collect(self) -> list[tuple] | None:
        """Samples (trajectory, advantage, reward) of `batch_groups` admitted groups; None if stopped.

        A batch is all or nothing: its offsets and counters join the trainer's state only once it
        is complete, so a stop half-way leaves nothing for the next checkpoint to record.
        """
        samples, groups, batch_ids, fresh = [], 0, set(), []
        offsets, counts = {}, Counts()
        while groups < self.tc.batch_groups:
            if self.stop.is_set():
                return None
            if self._replay_done():
                break  # the log's end: train on what is left, then stop
            if not self.pending:
                self._poll(0.5)
                continue
            if len(self.pending) < PENDING_TOP_UP:
                self._poll(0)  # what arrived meanwhile joins the choice of the oldest (`_take`)
                if not self.pending:  # that poll rebalanced the group: `_on_assign` dropped what was fetched
                    continue
            msg, eg = self._take()
            key = f"{msg.topic()}:{msg.partition()}"
            self.position[key] = offsets[key] = msg.offset() + 1
            if self._past_end(msg) or self._outside_time(msg) or eg is None:
                continue  # beyond the replayed range, or a rollout group the scorer filtered
            try:
                if isinstance(eg, Exception):
                    raise eg
                self._check_fits_model(eg)
                stale = counts.stale
                keep = admit_trajectories(eg.trajectories, self.state.version, self.max_staleness, self.seen,
                                          counts, batch_ids)
            except Exception as e:  # whatever one record does, it is dead-lettered, never a crash
                self._dead_letter(msg, e, counts)
                continue
            if keep:
                groups += 1
                samples += [(eg.trajectories[i], eg.advantages[i], eg.rewards[i]) for i in keep]
                fresh.append((msg.topic(), msg.partition(), msg.offset(), eg, keep))
            elif counts.stale > stale:
                self._dropped(GroupDropped(group_id=eg.group_id, reason="stale", role="trainer"))
        self.next_offsets.update(offsets)
        self.counts.add(counts)
        self.fresh_groups = fresh  # where each trained group is in the log: the replay buffer keeps it
        return samples or None
