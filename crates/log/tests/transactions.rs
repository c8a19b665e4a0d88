//! Transactions in the partition log (KIP-98, KIP-890): transactional batches, COMMIT/ABORT
//! markers, the last stable offset, the `.txnindex` in Kafka's format, KIP-890 verification
//! guards, and what survives a crash, a truncation and replication.

use std::path::Path;

use gregor_log::{
    AbortedTxn, AppendOrigin, LogConfig, LogError, PartitionLog, TopicPartition, VerificationGuard,
};
use gregor_protocol::batch::{BatchBuilder, Batches};
use gregor_protocol::control::{EndTxnMarker, TransactionResult};

const NOW_MS: i64 = 1_700_000_000_000;

fn open(dir: &Path, config: LogConfig, clean: bool) -> PartitionLog {
    PartitionLog::open(dir, TopicPartition::new("t", 0), config, clean).unwrap()
}

/// A transactional batch of `n` records of producer `pid`.
fn txn_batch(pid: i64, epoch: i16, seq: i32, n: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(0, NOW_MS)
        .producer(pid, epoch, seq)
        .transactional(true, false);
    for i in 0..n {
        b = b.record(
            NOW_MS,
            None,
            Some(format!("p{pid}-{seq}-{i}").as_bytes()),
            &[],
        );
    }
    b.build()
}

fn plain(n: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(0, NOW_MS);
    for _ in 0..n {
        b = b.record(NOW_MS, None, Some(b"plain"), &[]);
    }
    b.build()
}

fn write(log: &PartitionLog, mut b: Vec<u8>) -> (i64, i64) {
    let info = log.append_as_leader(&mut b, 0, NOW_MS).unwrap();
    (info.first_offset, info.last_offset)
}

fn marker(log: &PartitionLog, pid: i64, epoch: i16, commit: bool, coordinator_epoch: i32) -> i64 {
    log.append_txn_marker(
        pid,
        epoch,
        EndTxnMarker {
            result: TransactionResult::from_commit_flag(commit),
            coordinator_epoch,
        },
        0,
        NOW_MS,
    )
    .unwrap()
    .first_offset
}

fn aborted(pid: i64, first: i64, last: i64, lso: i64) -> AbortedTxn {
    AbortedTxn {
        producer_id: pid,
        first_offset: first,
        last_offset: last,
        last_stable_offset: lso,
    }
}

fn all_aborted(log: &PartitionLog) -> Vec<AbortedTxn> {
    log.aborted_transactions_by_segment()
        .unwrap()
        .into_iter()
        .flat_map(|(_, a)| a)
        .collect()
}

/// Two producers interleaved: the LSO is the first offset of the earliest open transaction
/// (capped by the high watermark), a completed transaction is stable only once the high
/// watermark passes its marker, an ABORT is indexed with the LSO after it, and the index file
/// holds Kafka's 34-byte entries.
#[test]
fn lso_follows_open_transactions_and_aborts_are_indexed() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), LogConfig::default(), true);
    assert_eq!(write(&log, plain(2)), (0, 1));
    assert_eq!(log.first_unstable_offset(), None);
    assert_eq!(log.last_stable_offset(2), 2);
    // Producer 7 opens a transaction at 2, producer 9 at 4.
    assert_eq!(write(&log, txn_batch(7, 0, 0, 2)), (2, 3));
    assert_eq!(write(&log, txn_batch(9, 0, 0, 1)), (4, 4));
    assert_eq!(write(&log, txn_batch(7, 0, 2, 1)), (5, 5));
    assert_eq!(log.first_unstable_offset(), Some(2));
    assert_eq!(log.last_stable_offset(6), 2);
    // Below the high watermark only.
    assert_eq!(log.last_stable_offset(1), 1);
    // Producer 7 aborts: marker at 6, the LSO after it is producer 9's first offset.
    assert_eq!(marker(&log, 7, 0, false, 3), 6);
    assert_eq!(all_aborted(&log), vec![aborted(7, 2, 6, 4)]);
    // Until the high watermark passes the marker, producer 7's transaction is unstable.
    assert_eq!(log.first_unstable_offset(), Some(2));
    log.on_high_watermark_updated(6);
    assert_eq!(log.first_unstable_offset(), Some(2));
    log.on_high_watermark_updated(7);
    assert_eq!(log.first_unstable_offset(), Some(4));
    // Producer 9 commits: nothing indexed; everything stable once replicated.
    assert_eq!(marker(&log, 9, 0, true, 3), 7);
    log.on_high_watermark_updated(8);
    assert_eq!(log.first_unstable_offset(), None);
    assert_eq!(log.last_stable_offset(8), 8);
    assert_eq!(all_aborted(&log), vec![aborted(7, 2, 6, 4)]);
    // Kafka's file format, byte for byte.
    let raw = std::fs::read(dir.path().join("00000000000000000000.txnindex")).unwrap();
    let mut expected = vec![0u8, 0];
    for v in [7i64, 2, 6, 4] {
        expected.extend_from_slice(&v.to_be_bytes());
    }
    assert_eq!(raw, expected);
    // The markers are control batches in the log, with Kafka's key and value.
    let r = log.read(6, 1 << 20, 8, true).unwrap();
    let headers: Vec<_> = Batches::new(&r.records).map(|b| b.unwrap().1).collect();
    assert_eq!(headers.len(), 2);
    assert!(headers
        .iter()
        .all(|h| h.is_control() && h.is_transactional()));
    // read_committed's aborted list for a range.
    assert_eq!(log.collect_aborted_transactions(0, 8).unwrap().len(), 1);
    assert!(log.collect_aborted_transactions(7, 8).unwrap().is_empty());
    assert_eq!(log.collect_aborted_transactions(3, 4).unwrap().len(), 1);
}

/// Kafka's producer-state checks: markers of an older producer epoch or coordinator epoch are
/// fenced, a producer cannot write outside its open transaction, and clients cannot write
/// control batches.
#[test]
fn markers_and_transactional_writes_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), LogConfig::default(), true);
    write(&log, txn_batch(5, 2, 0, 1));
    // A non-transactional write of the same producer while its transaction is open.
    let mut b = {
        let mut b = BatchBuilder::new(0, NOW_MS).producer(5, 2, 1);
        b = b.record(NOW_MS, None, Some(b"x"), &[]);
        b.build()
    };
    assert!(matches!(
        log.append_as_leader(&mut b, 0, NOW_MS),
        Err(LogError::InvalidTxnState(_))
    ));
    // A marker of an older producer epoch: INVALID_PRODUCER_EPOCH (47).
    let e = log
        .append_txn_marker(
            5,
            1,
            EndTxnMarker {
                result: TransactionResult::Commit,
                coordinator_epoch: 0,
            },
            0,
            NOW_MS,
        )
        .unwrap_err();
    assert_eq!(e.kafka_error_code(), 47);
    marker(&log, 5, 2, true, 4);
    log.on_high_watermark_updated(2);
    // A marker from an older coordinator epoch: TRANSACTION_COORDINATOR_FENCED (52).
    write(&log, txn_batch(5, 2, 1, 1));
    let e = log
        .append_txn_marker(
            5,
            2,
            EndTxnMarker {
                result: TransactionResult::Abort,
                coordinator_epoch: 3,
            },
            0,
            NOW_MS,
        )
        .unwrap_err();
    assert_eq!(e.kafka_error_code(), 52);
    assert_eq!(log.first_unstable_offset(), Some(2));
    // A bumped producer epoch (KIP-890 part 2) ends it: ABORT with epoch 3.
    assert_eq!(marker(&log, 5, 3, false, 4), 3);
    assert_eq!(all_aborted(&log), vec![aborted(5, 2, 3, 4)]);
    // The old epoch is fenced for data too.
    let mut old = txn_batch(5, 2, 2, 1);
    assert_eq!(
        log.append_as_leader(&mut old, 0, NOW_MS)
            .unwrap_err()
            .kafka_error_code(),
        47
    );
    // A marker of a producer with no open transaction is written and changes nothing else.
    assert_eq!(marker(&log, 77, 0, false, 0), 4);
    assert_eq!(all_aborted(&log).len(), 1);
    // A client may not write a control batch, even through the transactional path.
    let mut forged = gregor_protocol::control::end_txn_marker_batch(
        5,
        3,
        EndTxnMarker {
            result: TransactionResult::Commit,
            coordinator_epoch: 9,
        },
        NOW_MS,
    );
    assert_eq!(
        log.append_as_leader(&mut forged, 0, NOW_MS)
            .unwrap_err()
            .kafka_error_code(),
        87
    );
    let summaries = log.producer_summaries();
    let p5 = summaries.iter().find(|s| s.producer_id == 5).unwrap();
    assert_eq!((p5.producer_epoch, p5.coordinator_epoch), (3, 4));
    assert_eq!(p5.current_txn_start_offset, -1);
}

/// KIP-890: a producer's first transactional write needs the guard of its verification; later
/// writes of the open transaction need none; after the transaction ends the next first write
/// needs a new one.
#[test]
fn first_transactional_write_needs_the_verification_guard() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), LogConfig::default(), true);
    let append = |b: Vec<u8>, g: Option<VerificationGuard>| {
        let mut b = b;
        log.append_as_leader_from(&mut b, 0, NOW_MS, AppendOrigin::Client, g)
    };
    // No guard presented: refused.
    assert!(matches!(
        append(txn_batch(3, 0, 0, 1), Some(VerificationGuard::SENTINEL)),
        Err(LogError::InvalidTxnState(_))
    ));
    let guard = log
        .maybe_start_transaction_verification(3, 0, 0, false)
        .unwrap();
    assert!(!guard.is_sentinel());
    // The same producer asks again (a retry): the same guard.
    assert_eq!(
        log.maybe_start_transaction_verification(3, 0, 0, false)
            .unwrap(),
        guard
    );
    // A higher sequence than the lowest seen while verifying: OUT_OF_ORDER_SEQUENCE.
    assert_eq!(
        append(txn_batch(3, 0, 5, 1), Some(guard))
            .unwrap_err()
            .kafka_error_code(),
        45
    );
    // Another guard does not verify.
    let other = log
        .maybe_start_transaction_verification(4, 0, 0, false)
        .unwrap();
    assert!(append(txn_batch(3, 0, 0, 1), Some(other)).is_err());
    append(txn_batch(3, 0, 0, 1), Some(guard)).unwrap();
    // Open now: no verification needed.
    assert!(log
        .maybe_start_transaction_verification(3, 1, 0, false)
        .unwrap()
        .is_sentinel());
    append(txn_batch(3, 0, 1, 1), Some(VerificationGuard::SENTINEL)).unwrap();
    marker(&log, 3, 0, true, 0);
    // After the marker, the next transaction's first write needs verifying again.
    assert!(append(txn_batch(3, 0, 2, 1), Some(VerificationGuard::SENTINEL)).is_err());
    // Verification off (None): accepted.
    append(txn_batch(3, 0, 2, 1), None).unwrap();
}

/// Transaction version 2 (KIP-890 part 2, KAFKA-18575/KAFKA-18654): EndTxn bumps the epoch and
/// the coordinator writes the markers with the bumped epoch, so a producer's next
/// transaction can reach a partition leader before the previous one's marker does. That first
/// write of the new epoch is not part of the open transaction: it needs a verification of its
/// own, and the marker of the previous transaction (written with the new epoch) leaves that
/// verification in place, so the write lands as the first of a new transaction and the marker
/// commits only the old one.
#[test]
fn next_transaction_after_an_epoch_bump_is_verified_apart() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), LogConfig::default(), true);
    let append = |b: Vec<u8>, g: Option<VerificationGuard>| {
        let mut b = b;
        log.append_as_leader_from(&mut b, 0, NOW_MS, AppendOrigin::Client, g)
    };
    // Transaction 1 at epoch 0: verified first write, then one without verification.
    let g0 = log
        .maybe_start_transaction_verification(7, 0, 0, true)
        .unwrap();
    append(txn_batch(7, 0, 0, 2), Some(g0)).unwrap();
    assert!(log
        .maybe_start_transaction_verification(7, 2, 0, true)
        .unwrap()
        .is_sentinel());
    append(txn_batch(7, 0, 2, 1), Some(VerificationGuard::SENTINEL)).unwrap();
    // EndTxn bumped the epoch to 1; the client's next transaction starts before the marker.
    let g1 = log
        .maybe_start_transaction_verification(7, 0, 1, true)
        .unwrap();
    assert!(!g1.is_sentinel(), "epoch 1 is not the open transaction's");
    // Without the guard the new epoch's write is refused (it is not in the open transaction).
    assert!(matches!(
        append(txn_batch(7, 1, 0, 1), Some(VerificationGuard::SENTINEL)),
        Err(LogError::InvalidTxnState(_))
    ));
    // The previous transaction's COMMIT marker, written with the bumped epoch, arrives.
    let marker_offset = marker(&log, 7, 1, true, 0);
    assert_eq!(marker_offset, 3);
    log.on_high_watermark_updated(4);
    assert_eq!(log.first_unstable_offset(), None);
    // The verification of the next transaction survived the marker: its first write lands
    // and opens a new transaction at its own first offset.
    append(txn_batch(7, 1, 0, 1), Some(g1)).unwrap();
    assert_eq!(log.first_unstable_offset(), Some(4));
    // An older epoch asking to verify is refused at once (INVALID_PRODUCER_EPOCH).
    assert_eq!(
        log.maybe_start_transaction_verification(7, 3, 0, true)
            .unwrap_err()
            .kafka_error_code(),
        47
    );
    // Its ABORT (epoch 2 after the next bump) aborts only the new transaction.
    let abort_offset = marker(&log, 7, 2, false, 0);
    assert_eq!(
        all_aborted(&log),
        vec![aborted(7, 4, abort_offset, abort_offset + 1)]
    );

    // Without transaction.version 2 (no epoch bump support) a marker ends the verification
    // as before: the guard is gone and a new one is needed.
    let g = log
        .maybe_start_transaction_verification(8, 0, 0, false)
        .unwrap();
    marker(&log, 8, 0, false, 0);
    assert!(matches!(
        append(txn_batch(8, 0, 0, 1), Some(g)),
        Err(LogError::InvalidTxnState(_))
    ));
}

/// After a crash the open transaction and the aborted ones survive: producer state is
/// rebuilt from the log (the snapshot, then the batches and markers after it), and the
/// transaction index of every recovered segment is rebuilt from the markers, also when the
/// crash lost its entries.
#[test]
fn recovery_rebuilds_open_transactions_and_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 600,
        ..LogConfig::default()
    };
    let expected;
    {
        let log = open(dir.path(), config.clone(), true);
        for round in 0..6i32 {
            let pid = 100 + i64::from(round);
            write(&log, txn_batch(pid, 0, 0, 2));
            write(&log, plain(1));
            marker(&log, pid, 0, round % 2 == 0, 1);
        }
        // Producer 200's transaction stays open across the crash.
        write(&log, txn_batch(200, 0, 0, 1));
        write(&log, plain(1));
        assert!(log.num_segments() > 2, "the test needs several segments");
        expected = all_aborted(&log);
        assert_eq!(expected.len(), 3);
        log.on_high_watermark_updated(log.log_end_offset());
        assert_eq!(log.first_unstable_offset(), Some(24));
        // Crash: nothing closed, no shutdown snapshot.
    }
    // A crash between a marker and its index entry: the entries are lost.
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "txnindex") {
            std::fs::remove_file(p).unwrap();
        }
    }
    let log = open(dir.path(), config.clone(), false);
    assert_eq!(all_aborted(&log), expected);
    // Completed transactions wait for the high watermark (the partition sets it at start).
    log.on_high_watermark_updated(log.log_end_offset());
    assert_eq!(log.first_unstable_offset(), Some(24));
    assert_eq!(log.last_stable_offset(log.log_end_offset()), 24);
    // The open transaction can still be ended after the crash.
    let m = marker(&log, 200, 0, false, 1);
    log.on_high_watermark_updated(m + 1);
    assert_eq!(log.first_unstable_offset(), None);
    assert_eq!(all_aborted(&log).last(), Some(&aborted(200, 24, m, m + 1)));
    log.close().unwrap();
    // A clean restart reads the index as written.
    let log = open(dir.path(), config, true);
    assert_eq!(all_aborted(&log).len(), 4);
    assert_eq!(log.first_unstable_offset(), None);
}

/// Truncation (a follower cut back to its leader) reopens a transaction whose marker it
/// removed and drops that marker's index entry.
#[test]
fn truncation_reopens_the_transaction_of_a_removed_marker() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), LogConfig::default(), true);
    write(&log, txn_batch(1, 0, 0, 3));
    let m = marker(&log, 1, 0, false, 0);
    log.on_high_watermark_updated(m + 1);
    assert_eq!(all_aborted(&log).len(), 1);
    assert_eq!(log.first_unstable_offset(), None);
    log.truncate_to(m).unwrap();
    assert!(all_aborted(&log).is_empty());
    assert_eq!(log.first_unstable_offset(), Some(0));
    // The marker written again by the new leader is indexed again.
    let m2 = marker(&log, 1, 0, false, 0);
    assert_eq!(m2, m);
    assert_eq!(all_aborted(&log), vec![aborted(1, 0, m, m + 1)]);
}

/// A follower copying the leader's batches (markers included) ends with the same producer
/// state, LSO and transaction index.
#[test]
fn followers_track_transactions_from_replicated_batches() {
    let leader_dir = tempfile::tempdir().unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let leader = open(leader_dir.path(), LogConfig::default(), true);
    let follower = open(follower_dir.path(), LogConfig::default(), true);
    write(&leader, txn_batch(1, 0, 0, 2));
    write(&leader, txn_batch(2, 0, 0, 2));
    marker(&leader, 1, 0, false, 0);
    write(&leader, plain(1));
    let end = leader.log_end_offset();
    let r = leader.read(0, 1 << 20, end, true).unwrap();
    follower.append_as_follower(&r.records, NOW_MS).unwrap();
    assert_eq!(all_aborted(&follower), all_aborted(&leader));
    assert_eq!(all_aborted(&follower), vec![aborted(1, 0, 4, 2)]);
    follower.on_high_watermark_updated(end);
    leader.on_high_watermark_updated(end);
    assert_eq!(follower.first_unstable_offset(), Some(2));
    assert_eq!(leader.first_unstable_offset(), Some(2));
}
