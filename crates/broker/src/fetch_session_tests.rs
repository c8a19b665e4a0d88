//! Unit tests of the fetch session cache: contexts, epochs, errors, the omission rules, the
//! session's order, bounds and Kafka's eviction rules.

use super::*;

const EVICT_MS: i64 = 1_000;

fn name_part(topic: &str, partition: i32, fetch_offset: i64) -> SessionPartition {
    let n: Arc<str> = Arc::from(topic);
    SessionPartition {
        key: PartitionKey {
            topic: TopicKey::Name(n.clone()),
            partition,
        },
        name: Some(n),
        topic_id: Uuid::nil(),
        params: PartitionParams {
            fetch_offset,
            log_start_offset: -1,
            max_bytes: 1 << 20,
            current_leader_epoch: -1,
            last_fetched_epoch: -1,
        },
    }
}

fn id_part(id: Uuid, name: Option<&str>, partition: i32, fetch_offset: i64) -> SessionPartition {
    SessionPartition {
        key: PartitionKey {
            topic: TopicKey::Id(id),
            partition,
        },
        name: name.map(Arc::from),
        topic_id: id,
        params: PartitionParams {
            fetch_offset,
            log_start_offset: -1,
            max_bytes: 1 << 20,
            current_leader_epoch: -1,
            last_fetched_epoch: -1,
        },
    }
}

fn key(topic: &str, partition: i32) -> PartitionKey {
    PartitionKey {
        topic: TopicKey::Name(Arc::from(topic)),
        partition,
    }
}

/// An answer with no records at high watermark `hw`.
fn quiet(hw: i64) -> PartitionOutcome {
    PartitionOutcome {
        error_code: 0,
        high_watermark: hw,
        last_stable_offset: hw,
        log_start_offset: 0,
        records_bytes: 0,
        diverging_epoch: false,
        preferred_read_replica: false,
    }
}

fn no_resolve(_: &Uuid) -> Option<Arc<str>> {
    None
}

fn unbounded() -> usize {
    usize::MAX
}

fn view<'a>(
    version: i16,
    session_id: i32,
    epoch: i32,
    partitions: &'a [SessionPartition],
    forgotten: &'a [PartitionKey],
) -> FetchRequestView<'a> {
    FetchRequestView {
        version,
        session_id,
        epoch,
        is_follower: false,
        partitions,
        forgotten,
    }
}

/// A session over `parts` created by a full fetch (v12) whose partitions answered `hw`.
fn session(cache: &FetchSessionCache, parts: &[SessionPartition], hw: i64, now: i64) -> i32 {
    let ctx = cache.new_context(&view(12, 0, 0, parts, &[]), &no_resolve, &unbounded, now);
    assert!(matches!(
        ctx,
        FetchContext::Full {
            privileged: false,
            uses_topic_ids: false
        }
    ));
    let answered: Vec<_> = parts.iter().cloned().map(|p| (p, quiet(hw))).collect();
    cache.create_session(false, false, &answered, &unbounded, now)
}

/// An incremental fetch of `session_id` at `epoch` listing `changed`; panics unless it gets an
/// incremental context.
fn incremental(
    cache: &FetchSessionCache,
    session_id: i32,
    epoch: i32,
    changed: &[SessionPartition],
    forgotten: &[PartitionKey],
) -> Vec<SessionPartition> {
    match cache.new_context(
        &view(12, session_id, epoch, changed, forgotten),
        &no_resolve,
        &unbounded,
        0,
    ) {
        FetchContext::Incremental {
            session_id: id,
            request_epoch,
            partitions,
        } => {
            assert_eq!((id, request_epoch), (session_id, epoch));
            partitions
        }
        other => panic!("expected an incremental context, got {other:?}"),
    }
}

fn offsets(parts: &[SessionPartition]) -> Vec<(String, i32, i64)> {
    parts
        .iter()
        .map(|p| {
            let TopicKey::Name(n) = &p.key.topic else {
                panic!("name-keyed session expected")
            };
            (n.to_string(), p.key.partition, p.params.fetch_offset)
        })
        .collect()
}

#[test]
fn epochs_follow_kafka() {
    assert_eq!(next_epoch(INITIAL_EPOCH), 1);
    assert_eq!(next_epoch(1), 2);
    assert_eq!(next_epoch(i32::MAX), 1);
    assert_eq!(next_epoch(FINAL_EPOCH), FINAL_EPOCH);
    assert_eq!(next_epoch(-7), FINAL_EPOCH);
}

#[test]
fn sessionless_and_full_contexts() {
    let cache = FetchSessionCache::new(1000, EVICT_MS);
    let parts = [name_part("a", 0, 0)];
    // Fetch v0-v6 have no session fields: sessionless whatever the (default) values.
    let ctx = cache.new_context(&view(6, 0, 0, &parts, &[]), &no_resolve, &unbounded, 0);
    assert!(matches!(ctx, FetchContext::Sessionless));
    let ctx = cache.new_context(&view(12, 0, -1, &parts, &[]), &no_resolve, &unbounded, 0);
    assert!(matches!(ctx, FetchContext::Sessionless));
    let ctx = cache.new_context(&view(13, 0, 0, &parts, &[]), &no_resolve, &unbounded, 0);
    assert!(matches!(
        ctx,
        FetchContext::Full {
            uses_topic_ids: true,
            ..
        }
    ));
    let mut follower = view(12, 0, 0, &parts, &[]);
    follower.is_follower = true;
    let ctx = cache.new_context(&follower, &no_resolve, &unbounded, 0);
    assert!(matches!(
        ctx,
        FetchContext::Full {
            privileged: true,
            ..
        }
    ));

    let id = session(&cache, &parts, 5, 0);
    assert_ne!(id, INVALID_SESSION_ID);
    assert!(id > 0);
    assert_eq!((cache.len(), cache.total_partitions()), (1, 1));
    // The first incremental fetch carries epoch 1.
    incremental(&cache, id, 1, &[], &[]);
    incremental(&cache, id, 2, &[], &[]);

    // A full fetch naming the session closes it (and may open a new one).
    let ctx = cache.new_context(&view(12, id, 0, &parts, &[]), &no_resolve, &unbounded, 0);
    assert!(matches!(ctx, FetchContext::Full { .. }));
    assert!(cache.is_empty());
    // Epoch -1 with an id closes it and is sessionless.
    let id = session(&cache, &parts, 5, 0);
    assert_eq!(cache.len(), 1);
    let ctx = cache.new_context(&view(12, id, -1, &parts, &[]), &no_resolve, &unbounded, 0);
    assert!(matches!(ctx, FetchContext::Sessionless));
    assert!(cache.is_empty());
    assert_eq!(cache.total_partitions(), 0);
}

#[test]
fn session_errors() {
    let cache = FetchSessionCache::new(1000, EVICT_MS);
    let parts = [name_part("a", 0, 0)];
    let err = |version: i16, id: i32, epoch: i32| match cache.new_context(
        &view(version, id, epoch, &[], &[]),
        &no_resolve,
        &unbounded,
        0,
    ) {
        FetchContext::SessionError(code) => code,
        other => panic!("expected an error, got {other:?}"),
    };
    assert_eq!(err(12, 12345, 1), ec::FETCH_SESSION_ID_NOT_FOUND);
    assert_eq!(err(12, 0, 1), ec::FETCH_SESSION_ID_NOT_FOUND);
    assert_eq!(err(12, -5, 1), ec::FETCH_SESSION_ID_NOT_FOUND);
    assert_eq!(err(12, i32::MAX, 1), ec::FETCH_SESSION_ID_NOT_FOUND);
    let id = session(&cache, &parts, 5, 0);
    assert_eq!(err(12, id, 2), ec::INVALID_FETCH_SESSION_EPOCH);
    assert_eq!(err(12, id, -3), ec::INVALID_FETCH_SESSION_EPOCH);
    // A session created without topic ids cannot be used by a v13+ request.
    assert_eq!(err(13, id, 1), ec::FETCH_SESSION_TOPIC_ID_ERROR);
    // Errors leave the session as it was: epoch 1 still works.
    incremental(&cache, id, 1, &[], &[]);
    // A duplicate of that request is refused.
    assert_eq!(err(12, id, 1), ec::INVALID_FETCH_SESSION_EPOCH);
}

#[test]
fn topic_id_sessions_resolve_names_later() {
    let cache = FetchSessionCache::new(1000, EVICT_MS);
    let known = Uuid::from_u128(1);
    let later = Uuid::from_u128(2);
    let parts = [id_part(known, Some("k"), 0, 0), id_part(later, None, 0, 0)];
    let answered: Vec<_> = parts.iter().cloned().map(|p| (p, quiet(0))).collect();
    let id = cache.create_session(false, true, &answered, &unbounded, 0);
    let err = cache.new_context(&view(12, id, 1, &[], &[]), &no_resolve, &unbounded, 0);
    assert!(matches!(
        err,
        FetchContext::SessionError(ec::FETCH_SESSION_TOPIC_ID_ERROR)
    ));
    let resolve = |u: &Uuid| (*u == later).then(|| Arc::from("l"));
    let FetchContext::Incremental { partitions, .. } =
        cache.new_context(&view(13, id, 1, &[], &[]), &resolve, &unbounded, 0)
    else {
        panic!("incremental expected")
    };
    let names: Vec<_> = partitions.iter().map(|p| p.name.as_deref()).collect();
    assert_eq!(names, vec![Some("k"), Some("l")]);
}

#[test]
fn requests_update_cached_fetch_offsets_and_forget() {
    let cache = FetchSessionCache::new(1000, EVICT_MS);
    let parts = [
        name_part("a", 0, 10),
        name_part("a", 1, 20),
        name_part("b", 0, 30),
    ];
    let id = session(&cache, &parts, 100, 0);
    // Unlisted partitions keep their cached offsets; listed ones take the request's.
    let got = incremental(&cache, id, 1, &[name_part("a", 1, 25)], &[]);
    assert_eq!(
        offsets(&got),
        vec![
            ("a".into(), 0, 10),
            ("a".into(), 1, 25),
            ("b".into(), 0, 30)
        ]
    );
    // The update is kept for the following fetches.
    let got = incremental(&cache, id, 2, &[], &[]);
    assert_eq!(offsets(&got)[1], ("a".into(), 1, 25));
    // A new partition joins at the end; a forgotten one leaves.
    let got = incremental(&cache, id, 3, &[name_part("c", 0, 0)], &[key("a", 0)]);
    assert_eq!(
        offsets(&got),
        vec![("a".into(), 1, 25), ("b".into(), 0, 30), ("c".into(), 0, 0)]
    );
    assert_eq!(cache.total_partitions(), 3);
    // Forgetting everything ends the session; the fetch is sessionless.
    let ctx = cache.new_context(
        &view(12, id, 4, &[], &[key("a", 1), key("b", 0), key("c", 0)]),
        &no_resolve,
        &unbounded,
        0,
    );
    assert!(matches!(ctx, FetchContext::Sessionless));
    assert!(cache.is_empty());
    assert_eq!(cache.total_partitions(), 0);
}

#[test]
fn omission_rules() {
    let cache = FetchSessionCache::new(1000, EVICT_MS);
    let parts = [name_part("a", 0, 0)];
    let id = session(&cache, &parts, 5, 0);
    let mut epoch = 1;
    // One incremental round trip answering `o`: whether the partition is in the response.
    let mut round = |o: PartitionOutcome| {
        let got = incremental(&cache, id, epoch, &[], &[]);
        let inc = cache
            .complete_incremental(id, epoch, &got, &[o])
            .expect("same epoch");
        epoch += 1;
        inc[0]
    };
    assert!(!round(quiet(5)), "nothing changed");
    assert!(round(quiet(6)), "new high watermark");
    assert!(!round(quiet(6)), "the new high watermark was recorded");
    assert!(
        round(PartitionOutcome {
            records_bytes: 100,
            ..quiet(6)
        }),
        "records"
    );
    assert!(
        round(PartitionOutcome {
            last_stable_offset: 4,
            ..quiet(6)
        }),
        "new last stable offset"
    );
    assert!(!round(PartitionOutcome {
        last_stable_offset: 4,
        ..quiet(6)
    }));
    assert!(
        round(PartitionOutcome {
            last_stable_offset: 4,
            log_start_offset: 3,
            ..quiet(6)
        }),
        "new log start offset"
    );
    let base = PartitionOutcome {
        last_stable_offset: 4,
        log_start_offset: 3,
        ..quiet(6)
    };
    assert!(!round(base));
    assert!(
        round(PartitionOutcome {
            diverging_epoch: true,
            ..base
        }),
        "diverging epoch"
    );
    assert!(
        round(PartitionOutcome {
            preferred_read_replica: true,
            ..base
        }),
        "preferred read replica"
    );
    let error = PartitionOutcome {
        error_code: ec::NOT_LEADER_OR_FOLLOWER,
        ..base
    };
    assert!(round(error), "error");
    assert!(round(error), "errors are always answered");
    assert!(round(base), "answered again once the error is gone");
    assert!(!round(base));
}

#[test]
fn partitions_with_records_move_to_the_end() {
    let cache = FetchSessionCache::new(1000, EVICT_MS);
    let parts = [
        name_part("a", 0, 0),
        name_part("a", 1, 0),
        name_part("a", 2, 0),
    ];
    let id = session(&cache, &parts, 5, 0);
    let got = incremental(&cache, id, 1, &[], &[]);
    let with_records = PartitionOutcome {
        records_bytes: 10,
        ..quiet(5)
    };
    let inc = cache
        .complete_incremental(id, 1, &got, &[with_records, quiet(5), with_records])
        .expect("same epoch");
    assert_eq!(inc, vec![true, false, true]);
    let got = incremental(&cache, id, 2, &[], &[]);
    let order: Vec<i32> = got.iter().map(|p| p.key.partition).collect();
    assert_eq!(order, vec![1, 0, 2]);
    // The moved partitions keep their cached state.
    let inc = cache
        .complete_incremental(id, 2, &got, &[quiet(5), quiet(5), quiet(5)])
        .expect("same epoch");
    assert_eq!(inc, vec![false, false, false]);
}

#[test]
fn a_request_overtaken_by_another_gets_invalid_epoch() {
    let cache = FetchSessionCache::new(1000, EVICT_MS);
    let parts = [name_part("a", 0, 0)];
    let id = session(&cache, &parts, 5, 0);
    let first = incremental(&cache, id, 1, &[], &[]);
    // A second request of the session is handled while the first waits (long poll).
    let second = incremental(&cache, id, 2, &[], &[]);
    assert_eq!(
        cache.complete_incremental(id, 1, &first, &[quiet(6)]),
        Err(ec::INVALID_FETCH_SESSION_EPOCH)
    );
    assert_eq!(
        cache.complete_incremental(id, 2, &second, &[quiet(6)]),
        Ok(vec![true])
    );
}

#[test]
fn an_evicted_session_answers_every_partition() {
    let cache = FetchSessionCache::new(1000, EVICT_MS);
    let parts = [name_part("a", 0, 0), name_part("a", 1, 0)];
    let id = session(&cache, &parts, 5, 0);
    let got = incremental(&cache, id, 1, &[], &[]);
    // Closed by a full fetch naming it while this one was read.
    cache.new_context(&view(12, id, -1, &[], &[]), &no_resolve, &unbounded, 0);
    assert_eq!(
        cache.complete_incremental(id, 1, &got, &[quiet(5), quiet(5)]),
        Ok(vec![true, true])
    );
}

#[test]
fn bounds() {
    let cache = FetchSessionCache::new(1000, EVICT_MS);
    let parts = [name_part("a", 0, 0), name_part("a", 1, 0)];
    let answered: Vec<_> = parts.iter().cloned().map(|p| (p, quiet(0))).collect();
    assert_eq!(
        cache.create_session(false, false, &answered, &|| 1, 0),
        INVALID_SESSION_ID,
        "more partitions than the limit: no session"
    );
    let long = "x".repeat(MAX_TOPIC_NAME_LEN + 1);
    let answered = vec![(name_part(&long, 0, 0), quiet(0))];
    assert_eq!(
        cache.create_session(false, false, &answered, &unbounded, 0),
        INVALID_SESSION_ID,
        "a name no topic can have: no session"
    );
    let answered: Vec<_> = parts.iter().cloned().map(|p| (p, quiet(0))).collect();
    let id = cache.create_session(false, false, &answered, &|| 2, 0);
    assert_ne!(id, INVALID_SESSION_ID);
    // Changing a cached partition does not grow the session.
    let ctx = cache.new_context(
        &view(12, id, 1, &[name_part("a", 0, 7)], &[]),
        &no_resolve,
        &|| 2,
        0,
    );
    assert!(matches!(ctx, FetchContext::Incremental { .. }));
    // Growing beyond the limit closes the session.
    let ctx = cache.new_context(
        &view(12, id, 2, &[name_part("b", 0, 0)], &[]),
        &no_resolve,
        &|| 2,
        0,
    );
    assert!(matches!(
        ctx,
        FetchContext::SessionError(ec::FETCH_SESSION_ID_NOT_FOUND)
    ));
    assert!(cache.is_empty());
    assert_eq!(cache.total_partitions(), 0);
}

/// Fills every shard of a cache of 8 slots (1 per shard) with an unprivileged session of one
/// partition, created at `now`; returns the ids in shard order.
fn fill(cache: &FetchSessionCache, now: i64) -> Vec<i32> {
    let parts = [name_part("a", 0, 0)];
    (0..NUM_SHARDS)
        .map(|_| {
            let id = session(cache, &parts, 0, now);
            assert_ne!(id, INVALID_SESSION_ID);
            id
        })
        .collect()
}

#[test]
fn shards_split_the_slots_and_ids() {
    // Fewer slots than shards: no shard holds a session, as in Kafka.
    let cache = FetchSessionCache::new(7, EVICT_MS);
    let parts = [name_part("a", 0, 0)];
    for _ in 0..NUM_SHARDS {
        assert_eq!(session(&cache, &parts, 0, 0), INVALID_SESSION_ID);
    }
    let cache = FetchSessionCache::new(8, EVICT_MS);
    let ids = fill(&cache, 0);
    let range = i32::MAX / NUM_SHARDS as i32;
    for (shard, id) in ids.iter().enumerate() {
        assert_eq!(usize::try_from(id / range).ok(), Some(shard), "id {id}");
    }
    assert_eq!(cache.len(), NUM_SHARDS);
    // Every shard is full and no session is old: a ninth is refused.
    assert_eq!(session(&cache, &parts, 0, 10), INVALID_SESSION_ID);
    assert_eq!(cache.evictions(), 0);
}

#[test]
fn stale_sessions_are_evicted() {
    let cache = FetchSessionCache::new(8, EVICT_MS);
    let ids = fill(&cache, 0);
    // Shard 0's session is used again; shard 1's is not (the next new session goes to
    // shard 0: 8 were created).
    incremental(&cache, ids[0], 1, &[], &[]);
    let parts = [name_part("a", 0, 0)];
    assert_eq!(
        session(&cache, &parts, 0, EVICT_MS),
        INVALID_SESSION_ID,
        "unused for exactly the eviction time: not stale yet"
    );
    // Shard 1 now: its session has been unused for more than the eviction time.
    let id = session(&cache, &parts, 0, EVICT_MS + 1);
    assert_ne!(id, INVALID_SESSION_ID);
    assert_eq!(cache.evictions(), 1);
    assert_eq!(cache.len(), NUM_SHARDS);
    let ctx = cache.new_context(&view(12, ids[1], 1, &[], &[]), &no_resolve, &unbounded, 0);
    assert!(matches!(
        ctx,
        FetchContext::SessionError(ec::FETCH_SESSION_ID_NOT_FOUND)
    ));
}

#[test]
fn followers_evict_consumers_and_bigger_sessions_evict_old_smaller_ones() {
    let cache = FetchSessionCache::new(8, EVICT_MS);
    let ids = fill(&cache, 0);
    // Keep every session in use, so none is stale.
    let touch_all = |epoch: i32, now: i64| {
        for id in &ids {
            let ctx = cache.new_context(
                &view(12, *id, epoch, &[], &[]),
                &no_resolve,
                &unbounded,
                now,
            );
            assert!(matches!(ctx, FetchContext::Incremental { .. }));
        }
    };
    touch_all(1, 10);
    let one = [(name_part("f", 0, 0), quiet(0))];
    // A follower's session evicts a young consumer session (shard 0).
    assert_ne!(
        cache.create_session(true, false, &one, &unbounded, 20),
        INVALID_SESSION_ID
    );
    assert_eq!(cache.evictions(), 1);
    // A consumer's session of the same size cannot evict a young consumer session (shard 1).
    assert_eq!(
        cache.create_session(false, false, &one, &unbounded, 20),
        INVALID_SESSION_ID
    );
    // Once the sessions are older than the eviction time (but still in use), a bigger
    // consumer session evicts a smaller one (shard 2), a same-sized one does not (shard 3).
    let now = EVICT_MS + 100;
    for id in &ids[1..] {
        let ctx = cache.new_context(&view(12, *id, 2, &[], &[]), &no_resolve, &unbounded, now);
        assert!(matches!(ctx, FetchContext::Incremental { .. }));
    }
    let two = [
        (name_part("g", 0, 0), quiet(0)),
        (name_part("g", 1, 0), quiet(0)),
    ];
    assert_ne!(
        cache.create_session(false, false, &two, &unbounded, now),
        INVALID_SESSION_ID
    );
    assert_eq!(cache.evictions(), 2);
    assert_eq!(
        cache.create_session(false, false, &one, &unbounded, now),
        INVALID_SESSION_ID
    );
    assert_eq!(cache.len(), NUM_SHARDS);
    assert_eq!(cache.total_partitions(), NUM_SHARDS + 1);
}

#[test]
fn young_follower_sessions_are_not_evicted_by_followers() {
    let cache = FetchSessionCache::new(8, EVICT_MS);
    let one = [(name_part("f", 0, 0), quiet(0))];
    for _ in 0..NUM_SHARDS {
        assert_ne!(
            cache.create_session(true, false, &one, &unbounded, 0),
            INVALID_SESSION_ID
        );
    }
    // Shard 0 again: its follower session is young and in use.
    assert_eq!(
        cache.create_session(true, false, &one, &unbounded, 10),
        INVALID_SESSION_ID
    );
    assert_eq!(cache.evictions(), 0);
}
