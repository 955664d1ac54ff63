from streamrft.producers.admission import admit, explorer_quota, run_quota


def test_run_quota_is_what_the_trainer_can_use_before_it_goes_stale():
    # (max_staleness + 1) * batch_groups * sync_interval
    assert run_quota(0, 8, 1) == 8
    assert run_quota(2, 8, 1) == 24
    assert run_quota(1, 3, 2) == 12


def test_explorer_quota_follows_the_slots_held():
    assert explorer_quota(8, 32, 64) == 4       # two explorers, half the slots each
    assert explorer_quota(8, 64, 64) == 8       # the other one left: all of it
    assert explorer_quota(24, 22, 64) == 9      # 8.25 rounded up
    assert explorer_quota(24, 21, 64) == 8      # 7.875 rounded up
    assert explorer_quota(1, 1, 64) == 1        # never 0 while a slot is held
    assert explorer_quota(8, 0, 64) == 0        # no slot (not joined yet, or more explorers than slots)


def test_admit_blocks_on_spent_quota_and_on_stale_weights():
    assert admit(engine_version=5, latest_version=5, started_with_version=0, max_staleness=1, quota=4)
    assert admit(5, 6, 3, 1, 4)           # one version behind is still within max_staleness=1
    assert not admit(5, 5, 4, 1, 4)       # quota spent: wait for a newer version
    assert not admit(5, 7, 0, 1, 4)       # engine already 2 versions behind the announced one
    assert not admit(3, 4, 0, 0, 4)       # on-policy: any lag blocks
    assert not admit(5, 5, 0, 1, 0)       # no share at all
