"""The trainer role: experiences in, weight versions out, exactly-once in effect.

Run with `streamrft train CONFIG`. Each step takes `batch_groups` groups off the experiences
topic (`consumers/intake.py`: oldest weights first across partitions, each partition in order),
drops trajectories already trained on (id window and the batch so far) or staler than `max_staleness`, and applies
the configured policy objective with old log-probs = the explorers' behaviour log-probs. A record
that fails in any way becomes a dead letter. A group dropped stale or dead-lettered is announced
on `<ns>.admission`, so explorers' admission control stops counting it (`producers/admission.py`).
Every `sync_interval` steps the step loop makes version N and hands a CPU copy of its weights to
the background publisher (`consumers/publisher.py`), which uploads it to S3 (manifest last) while
the loop goes on with step N+1; at most one version is in flight (the next hand-off waits). Every
`checkpoint_every` versions (and at the end) version N is also a checkpoint. Its order:
1. the loop flushes the dead letters and admission drops (durable before the offsets move past
   them) and writes the checkpoint's files (weights, optimiser) into `.tmp-v<N>` while it still
   owns the weights;
2. the publisher uploads version N to S3 (retried), then
3. finalises the checkpoint (next offsets, id window, trained ids since the previous checkpoint;
   rename, audit copy): a checkpoint is never durable before its version is in S3;
4. announces N on the weights topic (after the manifest, after the checkpoint);
5. the loop commits the checkpoint's offsets at its next hand-off (retried; the checkpoint, not
   the commit, is the authority).
A version between checkpoints is uploaded then announced. A publish that fails after its retries
fails the role (raised in the loop), which restarts from its checkpoint. On restart it resumes from
the newest complete checkpoint, seeks to its offsets and redoes the steps since; `_start_plan`
numbers the redone versions above every announced one, so version numbers never go backwards or
get reused, and the audit trail (one file per checkpoint, `consumers/checkpoint.py`) holds each
id of the final weights' lineage once.
With DeepSpeed (`trainer.engine: deepspeed`, ranks under torchrun) rank 0 alone talks to Kafka and
S3 and broadcasts each batch and the checkpoint to resume from; every rank makes the same
collectives in the same order (every update, the ZeRO-3 gather of each published version, the
checkpoint's shards), so no rank waits on a call another skipped (`consumers/update.py`).
With `model.lora` only adapters train, and every version (version 0 too: B = 0, the base itself)
and checkpoint holds the adapter alone, its manifest meta saying so (`kind: lora`, r, alpha).
Every version's meta names the base model files uploaded beside the versions (`base`, `base_sha256`).
With `trainer.replay_buffer` each step adds groups drawn from a prioritised buffer of recently
trained ones (`consumers/replay_buffer.py`, importance-weighted; `_next_samples`, `_after_step`): a
replayed use goes into the audit trail as `<id>#r<k>`, and the buffer's log locations into every
checkpoint, re-read by offset on resume. `trainer.sft_mix` adds CHORD's expert rows (`consumers/sft_mix.py`).
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from streamrft.config import RunConfig
from streamrft.consumers import checkpoint
from streamrft.consumers.admission import Counts, SeenWindow
from streamrft.consumers.publisher import Publisher, cpu_copy, retried
from streamrft.consumers.replay_buffer import ReplayBuffer
from streamrft.consumers.advantages import make_batch_advantage
from streamrft.consumers.intake import Intake
from streamrft.consumers.update import Objective, UpdateLoop
from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_consumer, make_producer, run_topics
from streamrft.infra.objectstore import WeightStore
from streamrft.infra.offset_gaps import OffsetGaps
from streamrft.monitor.loggers import MetricLogger
from streamrft.monitor.prometheus import role_metrics
from streamrft.schemas import DecodeError, ExperienceGroup, Metric, WeightVersion, decode, encode, topic_name

log = logging.getLogger(__name__)

COMMIT_ATTEMPTS = 6  # backoff 0.5 s doubling: ~15 s, enough for the group to be rejoined after a broker restart


class Trainer(Intake, UpdateLoop):
    def __init__(self, cfg: RunConfig, stop: threading.Event | None = None):
        from streamrft.engine.models import load_policy, load_processor, resolve_device
        from streamrft.engine.training import make_train_engine

        torch.manual_seed(cfg.trainer.seed)
        torch.set_num_threads(cfg.trainer.torch_threads)
        self.cfg, self.tc = cfg, cfg.trainer
        self.stop = stop or threading.Event()
        self.id = f"trainer-{os.getpid()}"
        self.ckpt_dir = Path(self.tc.checkpoint_dir or Path(cfg.output_dir) / "trainer")
        self.device = resolve_device(self.tc.device)
        model, self.tokenizer = load_policy(cfg.model.path, dtype=cfg.model.dtype, device=self.device)
        processor = load_processor(cfg.model.path)  # a vision-language model's; None for text
        self.pixels = None  # pixels(trajectory): the images its prompt shows, as the explorers' engines saw them
        if processor is not None:
            from streamrft.engine.vlm import trajectory_pixels
            from streamrft.infra.media import MediaStore

            self.pixels = trajectory_pixels(processor, MediaStore.for_run(cfg))
        self.engine = make_train_engine(self.tc, model, cfg.model.lora)
        self.model = self.engine.model  # with LoRA: wrapped with its adapters
        self.is_main = getattr(self.engine, "is_main", True)
        self.world = getattr(self.engine, "world", 1)
        log.info("policy on %s: %s engine, %d rank(s)", next(self.model.parameters()).device, self.tc.engine, self.world)
        self._lock = checkpoint.lock(self.ckpt_dir) if self.is_main else None
        found = checkpoint.latest(self.ckpt_dir) if self.is_main else None
        if self.world > 1:  # every rank loads the checkpoint rank 0 chose, holding the lock (a collective)
            found = self.engine.broadcast(found)
        self.state = checkpoint.TrainerState()
        if found is not None:
            self.engine.load(found[0])
            self.state = found[1]
            log.info("resumed from %s at version %d", found[0], self.state.version)
            if self.is_main:  # a crash between the checkpoint's rename and its audit copy
                checkpoint.sync_audit(self.ckpt_dir, found[0], self.state.version)
        self.resumed = found is not None
        self.seen = SeenWindow(dict(self.state.seen))
        self.counts = Counts(**self.state.counts)
        self.ref_model = None
        self.objective = Objective(cfg)
        self.batch_advantage = make_batch_advantage(cfg, self.device)
        if found is not None and hasattr(self.batch_advantage, "load"):
            self.batch_advantage.load(found[0])
        self.reward_kl = None
        if cfg.algorithm.kl.coef and cfg.algorithm.kl.mode == "reward":
            from streamrft.engine.algorithms import KL_ESTIMATORS

            self.reward_kl = KL_ESTIMATORS[cfg.algorithm.kl.estimator]
        if self.objective.kl_fn is not None or self.reward_kl is not None:
            self.ref_model, _ = load_policy(cfg.model.path, dtype=cfg.model.dtype, device=self.device)
            self.ref_model.eval().requires_grad_(False)
        ns = cfg.namespace
        self.replay = self.tc.replay
        self.max_staleness = None if self.replay else self.tc.max_staleness
        self.topic = topic_name(self.replay.namespace if self.replay else ns, "experiences")
        self.scorer = None
        if self.replay and self.replay.rollouts_team:  # rollouts scored again with this config's rewards
            from streamrft.stream_ops.scoring import build_scorer

            self.topic = topic_name(self.replay.namespace, "rollouts", self.replay.rollouts_team)
            self.scorer = build_scorer(cfg)
        self.sft = None
        if self.tc.sft_mix is not None:
            from streamrft.consumers.sft_mix import SftSource

            self.sft = SftSource(self.tc.sft_mix, self.tokenizer)
        self.buffer = ReplayBuffer(self.tc.replay_buffer, self.tc.seed) if self.tc.replay_buffer and self.is_main else None
        self.fresh_groups: list = []  # (topic, partition, offset, group, kept indices) of the last batch
        self.replayed: list = []      # (buffer entry, importance weight) of the last batch
        self.replay_end: dict[str, int] | None = None
        self.pending: list = []
        self._decoded: dict[tuple[str, int, int], ExperienceGroup | Exception] = {}  # of pending records
        self.next_offsets = dict(self.state.offsets)  # past every record of the batches trained so far
        self.position = dict(self.next_offsets)       # past every record taken off `pending`
        self.trained_since_ckpt: list[str] = []
        self.versions_since_ckpt = 0  # versions published since the last checkpoint
        self._to_commit: dict[str, int] | None = None  # a finalised checkpoint's offsets, not committed yet
        self.publisher = Publisher(on_error=lambda e: self.stop.set())  # a failure ends the loop; run() raises it
        self.update_metrics: list[dict[str, float]] = []  # one per optimiser update of the last step
        self._base_meta: dict | None = None  # `_version_meta`'s base, once uploaded
        self._delta = None  # engine.delta.DeltaPublisher with trainer.weight_sync.delta (full weights only)
        self._in_store: set[int] | None = None  # this model's versions in S3, once listed (`_gc`)
        self._audit_synced = False  # checkpoint.sync_audit has dropped higher versions' audit files
        self._announced_at: dict[int, float] = {}  # version -> when announced, until its first trajectory comes back
        # where publishing a version goes (metrics): this thread's parts of the last `publish`, and the
        # publisher thread's of the last version it finished (a whole dict, replaced by that thread)
        self.publish_times: dict[str, float] = {}
        self.publish_job_times: dict[str, float] = {}
        self.metric_logger = self.prom = None  # monitor.backends and /metrics, rank 0 (`streamrft run`
        # starts roles with no backends: it logs every role's metrics off the topic)
        self.progress = None  # replay: a bar of the records to read (monitor/bars.py)
        if self.is_main:  # with DeepSpeed data parallelism, rank 0 alone talks to Kafka and S3
            self.metric_logger = MetricLogger.for_run(cfg)
            self.prom = role_metrics(cfg.monitor.prometheus, "trainer")
            self.store = WeightStore(cfg.s3)
            self.producer = make_producer(cfg.kafka)
            self.announcer = make_producer(cfg.kafka)  # announces, from the publisher thread: a producer of its own
            if not self.replay:  # where dropped groups are announced to explorers (`_dropped`)
                admission = topic_name(ns, "admission")
                ensure_topics(cfg.kafka, {admission: run_topics(cfg.kafka, ns)[admission]})
            self.consumer = make_consumer(cfg.kafka, f"{ns}.trainer", loop_path=True)
            self.offset_gaps = OffsetGaps(cfg.kafka.gap_wait_s, name="trainer")
            self.consumer.subscribe([self.topic], on_assign=self._on_assign)
            if self.replay:
                self._start_replay()
            if self.buffer is not None and self.state.replay_buffer:  # rebuilt from the log, by offset
                self.buffer.restore(self.state.replay_buffer, self.read_groups)
                log.info("replay buffer restored: %d of %d groups", len(self.buffer), len(self.state.replay_buffer))

    # ---- versions ----------------------------------------------------------------------------
    def publish(self, checkpoint_due: bool = True) -> None:
        """Hand version `state.version` to the publisher, with its checkpoint if `checkpoint_due`
        (the order: the module's docstring). Returns once the publisher has the version; raises
        what the previous version's publishing failed with."""
        v, step = self.state.version, self.state.step
        self._await_publisher()  # back-pressure: one version in flight
        t0 = time.monotonic()
        weights = self.engine.publishable_state_dict()  # collective under ZeRO-3
        self.seen.prune(v, self.max_staleness)
        t1 = time.monotonic()
        ckpt = self._write_checkpoint_files() if checkpoint_due else None
        self.publish_times.update(publish_copy_s=t1 - t0, checkpoint_write_s=time.monotonic() - t1)
        self.versions_since_ckpt = 0 if checkpoint_due else self.versions_since_ckpt + 1
        if not self.is_main:
            return
        # the next step changes the live tensors; with delta sync, into the base the last delta
        # retired (the publisher is done with it: `_await_publisher` above)
        weights = cpu_copy(weights, into=self._delta.take_spare() if self._delta is not None else None)
        meta = self._version_meta()

        def job():
            marks = [time.monotonic()]
            manifest = retried(lambda: self._publish_weights(v, weights, meta), f"uploading v{v}")
            marks.append(time.monotonic())
            if ckpt is not None:  # the audit folder is listed at this trainer's first checkpoint only
                checkpoint.finalize(self.ckpt_dir, *ckpt, drop_higher_audit=not self._audit_synced)
                self._audit_synced = True
            marks.append(time.monotonic())
            # explorers load announced versions only; a checkpoint's version is announced once the
            # checkpoint is durable, so that with checkpoint_every=1 a restarted trainer redoes (and
            # overwrites in S3) only versions nobody loaded, and the version numbers stay dense
            self.announce(manifest.sha256, version=v, step=step)
            marks.append(time.monotonic())
            self._gc(v)
            marks.append(time.monotonic())
            self.publish_job_times = dict(zip(("upload_s", "checkpoint_finalize_s", "announce_s", "weights_gc_s"),
                                              (b - a for a, b in zip(marks, marks[1:]))))

        self.publisher.submit(f"v{v}", job)
        if ckpt is not None:
            self._to_commit = dict(ckpt[1].offsets)

    def _gc(self, v: int) -> None:
        """Old versions out of S3, keeping `trainer.keep_versions` (publisher thread). The versions
        in the store are listed once, then tracked: a listing costs more as deleted versions pile
        up (`WeightStore.gc`)."""
        if self._in_store is None:
            self._in_store = set(self.store.list_versions(self.cfg.weights_key))
        self._in_store.add(v)
        self._in_store -= set(self.store.gc(self.cfg.weights_key, self.tc.keep_versions, versions=self._in_store))

    def _write_checkpoint_files(self) -> tuple | None:
        """Step 1 of a checkpoint (every rank: DeepSpeed writes shards collectively): the state as
        of now and the engine's files in `.tmp-v<N>`; (tmp, state, trained ids) for `finalize`."""
        import copy

        self.state.seen, self.state.offsets, self.state.counts = dict(self.seen.ids), dict(self.next_offsets), self.counts.as_dict()
        self.state.replay_buffer = self.buffer.members() if self.buffer is not None else []
        barrier = getattr(self.engine, "barrier", lambda: None)
        if self.is_main:  # the dead letters of records this checkpoint moves past must be acknowledged first
            flush_or_raise(self.producer, timeout=60)
        tmp = checkpoint.write(self.ckpt_dir, self.state.version, self._write_checkpoint, is_main=self.is_main,
                               barrier=barrier)
        trained, self.trained_since_ckpt = self.trained_since_ckpt, []  # rank 0's copy goes into the checkpoint
        return (tmp, checkpoint.TrainerState(**copy.deepcopy(self.state.__dict__)), trained) if self.is_main else None

    def checkpoint_now(self) -> None:
        """A checkpoint of the version last published, without publishing it again (the end of a
        run whose last versions came between checkpoints). Only while the weights are that version's."""
        v = self.state.version
        self._await_publisher()
        ckpt = self._write_checkpoint_files()
        self.versions_since_ckpt = 0
        if self.is_main:
            self.publisher.submit(f"checkpoint v{v}", lambda: checkpoint.finalize(self.ckpt_dir, *ckpt))
            self._to_commit = dict(ckpt[1].offsets)

    def _await_publisher(self) -> None:
        """Wait for the version in flight (raising its failure), then commit its checkpoint's offsets."""
        if not self.is_main:
            return
        t0 = time.monotonic()
        self.publisher.wait()
        t1 = time.monotonic()
        if self._to_commit:
            self._commit(self._to_commit)
        self._to_commit = None
        self.publish_times.update(publish_wait_s=t1 - t0, commit_s=time.monotonic() - t1)

    def _publish_weights(self, v: int, weights: dict, meta: dict):
        """Version `v` to S3 (on the publisher's thread, one at a time): whole, or with
        `trainer.weight_sync.delta` (full weights only) as the delta from the version this process
        published last (`engine.delta.DeltaPublisher`)."""
        from streamrft.engine.weights import publish_state_dict

        sync = self.tc.weight_sync
        if sync.delta and self.cfg.model.lora is None:
            if self._delta is None:
                from streamrft.engine.delta import DeltaPublisher

                self._delta = DeltaPublisher(sync.full_every)
            # `weights` is the publisher's own CPU copy (`publish`): the next delta's base as it is
            return self._delta.publish(self.store, self.cfg.weights_key, v, weights, meta=meta, owned=True)
        return publish_state_dict(self.store, self.cfg.weights_key, v, weights, meta=meta)

    def _version_meta(self) -> dict:
        """A version's manifest meta: its step, what it holds (`LoraSpec.from_manifest` reads it) and
        where its base model's config and tokenizer are (with LoRA its weights too), uploaded with the
        first version this process publishes (`publish_base_model`: a restart finds them there), so
        that every version exports from S3 alone. Explorers read only what `from_manifest` reads."""
        from streamrft.engine.weights import publish_base_model

        lora = self.cfg.model.lora
        if self._base_meta is None:
            self._base_meta = publish_base_model(self.store, self.cfg.weights_key, self.cfg.model.path,
                                                 weights=lora is not None)
        return {"step": self.state.step, **(lora.manifest_meta() if lora else {"kind": "full"}), **self._base_meta}

    def _commit(self, offsets: dict[str, int]) -> None:
        """Commit a durable checkpoint's offsets for people and tools. The checkpoint, not this commit,
        is what a restart resumes from, so a commit that keeps failing is logged and skipped."""
        offsets = [TopicPartition(k.rsplit(":", 1)[0], int(k.rsplit(":", 1)[1]), o) for k, o in offsets.items()]
        delay = 0.5
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                self.consumer.commit(offsets=offsets, asynchronous=False)
                return
            except KafkaException as e:
                err = e.args[0] if e.args else None
                if isinstance(err, KafkaError) and err.fatal():
                    raise
                log.warning("offset commit for v%d failed (attempt %d/%d): %s", self.state.version, attempt,
                            COMMIT_ATTEMPTS, err)
            if attempt == COMMIT_ATTEMPTS:
                break
            # keep serving the consumer while waiting: after a broker restart (UNKNOWN_MEMBER_ID)
            # it rejoins its group only from inside consume(); what it fetches meanwhile is kept
            deadline = time.monotonic() + delay
            while (left := deadline - time.monotonic()) > 0:
                if len(self.pending) < 1024:
                    self._poll(min(left, 0.5))
                else:
                    time.sleep(min(left, 0.1))
            delay *= 2
        log.warning("gave up committing the offsets of v%d; its checkpoint holds them, and the next "
                    "version's commit carries newer ones", self.state.version)

    def _write_checkpoint(self, directory: Path) -> None:
        """Called on every rank (DeepSpeed writes its shards collectively); a critic (every rank
        trains its copy on the same whole batches) is written by rank 0 alone, not by all at once."""
        self.engine.save(directory)
        if hasattr(self.batch_advantage, "save") and self.is_main:
            self.batch_advantage.save(directory)

    def announce(self, manifest_sha: str = "", version: int | None = None, step: int | None = None) -> None:
        """Version `version` (default: the state's) on the weights topic; called by the publisher thread too."""
        version = self.state.version if version is None else version
        step = self.state.step if step is None else step
        self._announced_at[version] = time.monotonic()
        wv = WeightVersion(model=self.cfg.model.name, version=version, bucket=self.store.bucket,
                           prefix=self.store.prefix(self.cfg.weights_key, version),
                           manifest_sha256=manifest_sha, step=step)
        self.announcer.produce(topic_name(self.cfg.namespace, "weights"), key=self.cfg.model.name.encode(), value=encode(wv))
        flush_or_raise(self.announcer)

    def metric(self, values: dict[str, float]) -> None:
        if not self.is_main:
            return
        m = Metric.of_finite("trainer", self.id, self.state.step, values)  # a NaN grad norm must not crash the step
        self.producer.produce(topic_name(self.cfg.namespace, "metrics"), key=self.id.encode(), value=encode(m))
        self.metric_logger.log(m)
        self.prom.observe(m)

    def _next_samples(self) -> tuple[list[tuple] | None, list[float] | None]:
        """(samples, their weights: None = all 1): the fresh ones first, then the groups drawn from the
        replay buffer (`trainer.replay_buffer`) with their importance weights."""
        samples = self.collect() if self.is_main else None
        weights, self.replayed = None, []
        if samples is not None and self.buffer is not None:
            self.replayed = self.buffer.sample(self.state.version, self.state.step)
            weights = [1.0] * len(samples)
            for entry, w in self.replayed:
                eg = entry.group
                samples = samples + [(eg.trajectories[i], eg.advantages[i], eg.rewards[i]) for i in entry.keep]
                weights += [w] * len(entry.keep)
        if self.world > 1:
            samples, weights = self.engine.broadcast((samples, weights))  # None from rank 0 stops every rank
        return samples, weights

    def _after_step(self, samples: list[tuple]) -> None:
        """Record what the step trained: fresh ids in the window and the audit trail, replayed uses in
        the audit trail as `<id>#r<reuse>`; the fresh groups join the replay buffer."""
        fresh = len(samples) - sum(len(e.keep) for e, _ in self.replayed)
        for t, _, _ in samples[:fresh]:
            self.seen.add(t.traj_id, t.model_version)
            self.trained_since_ckpt.append(t.traj_id)
        self.counts.trained += fresh
        self.counts.groups_trained += len({t.group_id for t, _, _ in samples[:fresh]})
        if self.buffer is None:
            return
        rows, row = getattr(self, "row_abs_advantages", None) or [None] * len(samples), 0
        for topic, partition, offset, eg, keep in self.fresh_groups:
            self.buffer.add(topic, partition, offset, eg, keep, rows[row:row + len(keep)])
            row += len(keep)
        for entry, _ in self.replayed:
            self.trained_since_ckpt += [f"{entry.group.trajectories[i].traj_id}#r{entry.reuse}" for i in entry.keep]
            self.buffer.reprioritise(entry, rows[row:row + len(entry.keep)])
            row += len(entry.keep)
        self.counts.replayed += row - fresh

    # ---- start-up: versions never go backwards ------------------------------------------------
    def _newest_announced(self) -> int | None:
        """The highest version of this model announced on the weights topic (read to its true end)."""
        from streamrft.infra.kafka import partition_ends

        topic = topic_name(self.cfg.namespace, "weights")
        try:
            ends = [e for e in partition_ends(self.cfg.kafka, topic) if e.end > e.start]
        except KafkaException as e:
            if e.args and isinstance(e.args[0], KafkaError) and e.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return None  # nothing announced yet; the first announce creates the topic
            raise
        newest, left = None, {e.partition: e.end for e in ends}
        consumer = make_consumer(self.cfg.kafka, None)
        try:
            consumer.assign([TopicPartition(topic, e.partition, e.start) for e in ends])
            deadline = time.monotonic() + 60
            while left:
                if time.monotonic() > deadline:
                    raise KafkaException(f"could not read {topic} to its end in 60 s (still missing {left})")
                for m in consumer.consume(500, timeout=0.5):
                    if m.error() is not None:
                        if m.error().fatal():
                            raise KafkaException(m.error())
                        log.warning("consume error on %s: %s", topic, m.error())
                        continue
                    if m.offset() + 1 >= left.get(m.partition(), 0):
                        left.pop(m.partition(), None)
                    try:
                        wv = decode(m.value(), WeightVersion)
                    except DecodeError:
                        continue
                    if wv.model == self.cfg.model.name and (newest is None or wv.version > newest):
                        newest = wv.version
        finally:
            consumer.close()
        return newest

    def _start_plan(self) -> tuple[str, int]:
        """(what to do before the first step, the version to start at), from the checkpoint, the
        weights topic and S3.

        - S3 versions above both the checkpoint and the newest announce were published by a
          trainer that died before their checkpoint was durable. Nobody loaded them (explorers
          load announced versions only): they are deleted, and the coming steps redo them.
        - An announce above the checkpoint: with `checkpoint_every` > 1, versions published
          after the last checkpoint (the usual case after a crash), else newer checkpoints lost
          (a wiped disk). Training goes on from the checkpoint's weights and offsets, redoing the
          steps since, but numbered above every announced version, so an explorer that loaded
          version N never meets a different version N.
        - Otherwise the checkpoint's version is announced (again), unless it already is.
        """
        key = self.cfg.weights_key
        announced = self._newest_announced()
        ckpt = self.state.version if self.resumed else None
        known = max(v for v in (ckpt, announced, -1) if v is not None)
        in_s3 = self.store.list_versions(key)
        for v in in_s3:
            if v > known:
                log.warning("deleting v%d from S3: published by a trainer that died before its checkpoint; "
                            "it is trained again", v)
                self.store.delete_version(key, v)
        if announced is not None and (ckpt is None or announced > ckpt):
            log.warning("v%d is announced but the newest checkpoint in %s is %s: continuing from the "
                        "checkpoint (redoing the steps since), numbering the next version v%d", announced, self.ckpt_dir,
                        "none" if ckpt is None else f"v{ckpt}", announced + 1)
            return ("publish", announced + 1) if ckpt is None else ("none", announced)
        if ckpt is None:
            return "publish", 0  # version 0 = the initial weights, so every explorer can verify what it runs
        if announced == ckpt:
            return "none", ckpt
        return ("announce" if ckpt in in_s3 else "republish"), ckpt

    def _start(self) -> None:
        if self.is_main:
            self.store.ensure_bucket()
        plan = self._start_plan() if self.is_main else None
        if self.world > 1:
            plan = self.engine.broadcast(plan)
        action, self.state.version = plan
        v = self.state.version
        if action == "publish":
            self.publish()
        elif action == "announce" and self.is_main:
            self.announce(self.store.read_manifest(self.cfg.weights_key, v).sha256)
        elif action == "republish":  # S3 lost the checkpoint's version: upload the same weights again
            weights = self.engine.publishable_state_dict()  # collective under ZeRO-3
            if self.is_main:
                self.announce(self._publish_weights(v, weights, self._version_meta()).sha256)

    def run(self) -> dict:
        try:
            return self._run()
        finally:
            self.publisher.close()  # nothing writes the checkpoint directory once its lock is given up
            for closing in (self.progress, self.metric_logger, self.prom, getattr(self, "producer", None),
                            getattr(self, "announcer", None)):
                if closing is not None:
                    closing.close()
            if getattr(self, "consumer", None) is not None:
                try:
                    self.consumer.close()  # after an error too: leave the group, stop connecting
                except RuntimeError:  # closed already, at the end of `_run`
                    pass
            if self._lock is not None:
                checkpoint.unlock(self._lock)
                self._lock = None

    def _loop_latency(self, versions: set[int], now: float) -> float | None:
        """The loop's own latency: from announcing a version to the first trajectory generated with it
        reaching a batch (seconds; None when this batch holds no version seen for the first time)."""
        latency = None
        for v in sorted(versions):
            announced = self._announced_at.pop(v, None)
            if announced is not None:
                latency = now - announced
        for v in [v for v in list(self._announced_at) if v < min(versions)]:  # never used: forget them (list(): the publisher adds)
            self._announced_at.pop(v, None)
        return latency

    def _replay_read(self) -> int:
        """Replay: records read so far of the log up to its fixed end (all partitions)."""
        return sum(min(self.position.get(k, 0), end) for k, end in self.replay_end.items())

    def _run(self) -> dict:
        self._start()
        if self.replay_end is not None:
            from streamrft.monitor.bars import bar

            start = self._replay_read()
            self.progress = bar(sum(self.replay_end.values()) - start, f"replaying {self.topic}", unit="record")
        while self.state.step < self.tc.max_steps:
            t0 = time.monotonic()
            samples, weights = self._next_samples()
            if samples is None:
                break
            t1 = time.monotonic()
            replayed = sum(len(e.keep) for e, _ in self.replayed)
            latency = self._loop_latency({t.model_version for t, _, _ in samples[:len(samples) - replayed]}, t1)
            metrics = self.train_step(samples, weights)
            if self.buffer is not None:
                metrics.update(share_replay=replayed / len(samples), replay_buffer_size=float(len(self.buffer)),
                               **({"replay_weight_mean": sum(w for _, w in self.replayed) / len(self.replayed)}
                                  if self.replayed else {}))
            self._after_step(samples)
            self.state.step += 1
            t2 = time.monotonic()
            if self.state.step % self.tc.sync_interval == 0:
                self.state.version += 1
                self.publish(checkpoint_due=self.versions_since_ckpt + 1 >= self.tc.checkpoint_every)
            metrics.update(version=self.state.version, wait_s=t1 - t0, step_s=t2 - t1, publish_s=time.monotonic() - t2,
                           **self.publish_times, **self.publish_job_times,
                           **({"loop_latency_s": latency} if latency is not None else {}),
                           **{f"count_{k}": v for k, v in self.counts.as_dict().items()},
                           **(self.offset_gaps.stats() if self.is_main else {}))
            self.metric(metrics)
            if self.progress is not None:
                self.progress.update(self._replay_read() - start - self.progress.n)
            log.info("step %d v%d loss %.4f reward %.3f", self.state.step, self.state.version,
                     metrics.get("loss", 0.0), metrics["reward_mean"])
        self._await_publisher()  # raises a failed publish: the role restarts from its checkpoint
        if self.replay and self.state.step % self.tc.sync_interval:
            self.state.version += 1  # the end of the log: publish the steps since the last version
            self.publish()
        elif self.versions_since_ckpt and self.state.step % self.tc.sync_interval == 0:
            self.checkpoint_now()  # the last versions came between checkpoints; the weights are the last one's
        self._await_publisher()
        if self.is_main:
            flush_or_raise(self.producer)
            self.consumer.close()
        if hasattr(self.engine, "close"):
            self.engine.close()
        return {"version": self.state.version, "step": self.state.step, **self.counts.as_dict()}


def relaunch_under_torchrun(cfg: RunConfig, argv: list[str]) -> int | None:
    """DeepSpeed with several processes: re-run this command under torchrun (None = no need)."""
    import subprocess
    import sys

    n = cfg.trainer.deepspeed.num_gpus
    if cfg.trainer.engine != "deepspeed" or n <= 1 or "LOCAL_RANK" in os.environ:
        return None
    from streamrft.engine.training.deepspeed_engine import _free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", "-m", "streamrft.cli", *argv]
    return subprocess.call(cmd)


def run_trainer(cfg: RunConfig) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    result = Trainer(cfg, stop).run()
    print(f"trainer done: {result}", flush=True)
    if cfg.trainer.engine == "deepspeed" and "LOCAL_RANK" in os.environ:
        # a rank under torchrun: its versions, checkpoints and offsets are durable by now, and the
        # process group is gone (`close`). The interpreter's teardown can still abort in C++ now
        # and then ("terminate called without an active exception", SIGABRT: a thread of torch's
        # distributed stack destroyed while joinable), which torchrun reports as the run failing
        # and answers by SIGTERMing the other ranks; so a rank leaves without it.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
