from streamrft.producers.admission import admit, per_version_quota


def test_quota_splits_what_the_trainer_can_use_before_it_goes_stale():
    # (max_staleness + 1) * batch_groups * sync_interval / explorers, rounded up
    assert per_version_quota(0, 8, 1, 2) == 4
    assert per_version_quota(2, 8, 1, 2) == 12
    assert per_version_quota(1, 3, 2, 4) == 3   # 12 / 4
    assert per_version_quota(0, 1, 1, 3) == 1   # never 0


def test_admit_blocks_on_spent_quota_and_on_stale_weights():
    assert admit(engine_version=5, latest_version=5, started_with_version=0, max_staleness=1, quota=4)
    assert admit(5, 6, 3, 1, 4)           # one version behind is still within max_staleness=1
    assert not admit(5, 5, 4, 1, 4)       # quota spent: wait for a newer version
    assert not admit(5, 7, 0, 1, 4)       # engine already 2 versions behind the announced one
    assert not admit(3, 4, 0, 0, 4)       # on-policy: any lag blocks
