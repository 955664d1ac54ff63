"""Admission control holds at the gateway: a group that would reach the trainer too stale is refused
with 429 and Retry-After, and so is any episode while the served weights are staler than
`trainer.max_staleness` behind the newest announced version. Episodes already running go on, and so
does a new episode of a group already open: refusing it would hold the group's admission slot until
the group timed out."""
from __future__ import annotations

import uuid

import httpx

from gateway_helpers import KEYS, gateway_config, serving
from streamrft.infra.kafka import flush_or_raise, make_producer
from streamrft.schemas import ExplorerLedger, WeightVersion, decode, encode, topic_name
from tests_helpers import read_all

HEADERS = {"Authorization": f"Bearer {KEYS['agents']}"}


def _call(url: str, episode: str, group: str, size: int = 1) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"prompt": "abc", "max_tokens": 2, "episode_id": episode,
                                                     "group_id": group, "group_size": size},
                      headers=HEADERS, timeout=60)


def test_groups_beyond_the_staleness_bound_get_429_and_running_episodes_go_on(stack, tmp_path):
    # G = batch_groups x sync_interval = 2 groups per version, max_staleness 1: at v0 with no trainer,
    # (0 + 1 + 1) x 2 = 4 groups may be generated, no more
    cfg = gateway_config(stack, tmp_path, f"gw-adm-{uuid.uuid4().hex[:8]}")
    with serving(cfg) as served:
        episodes = [uuid.uuid4().hex for _ in range(3)]
        for e in episodes:
            assert _call(served.url, e, "g-" + e).status_code == 200
        assert _call(served.url, "pair-a", "g-pair", size=2).status_code == 200  # the 4th group, open
        refused = _call(served.url, "late", "g-late")
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "admission" and int(refused.headers["Retry-After"]) >= 1
        assert _call(served.url, episodes[0], "g-" + episodes[0]).status_code == 200  # a running episode goes on
        for e in episodes:
            r = httpx.post(f"{served.url}/v1/episodes/{e}/finish", json={"reward": 1.0}, headers=HEADERS, timeout=60)
            assert r.json()["status"] == "published"
        finish = httpx.post(f"{served.url}/v1/episodes/pair-a/finish", json={"reward": 1.0}, headers=HEADERS, timeout=60)
        assert finish.json()["status"] == "pending"
        # the published groups count as generated: still no room until the trainer moves on
        assert _call(served.url, "later", "g-later").status_code == 429
        assert served.gw.store.counters["agents"]["rejected_admission"] == 2

        # the newest version is announced but cannot be loaded (not in S3): the served v0 is 2 behind
        producer = make_producer(cfg.kafka)
        producer.produce(topic_name(cfg.namespace, "weights"), key=b"policy", value=encode(WeightVersion(
            model=cfg.model.name, version=2, bucket=cfg.s3.bucket, prefix=f"{cfg.weights_key}/v2/")))
        flush_or_raise(producer)
        import time

        deadline = time.monotonic() + 30
        while served.gw.can_start()[0] and time.monotonic() < deadline:
            time.sleep(0.2)
        stale = _call(served.url, "stale", "g-stale")
        assert stale.status_code == 429 and stale.json()["error"]["code"] == "stale_weights", stale.text
        # the open group's second episode is served all the same, and the group completes
        assert _call(served.url, "pair-b", "g-pair", size=2).status_code == 200
        finish = httpx.post(f"{served.url}/v1/episodes/pair-b/finish", json={"reward": 0.0}, headers=HEADERS, timeout=60)
        assert finish.json()["status"] == "published"

    # the gateway's ledger on the admission topic: 4 produced, nothing left in flight
    ledgers = [r for r in (decode(m.value()) for m in read_all(cfg.kafka, topic_name(cfg.namespace, "admission")))
               if isinstance(r, ExplorerLedger)]
    assert ledgers and ledgers[-1].produced == 4 and ledgers[-1].in_flight == 0
