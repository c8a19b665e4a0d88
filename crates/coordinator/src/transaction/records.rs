//! The records of `__transaction_state`, in Kafka's own schemas
//! (`transaction-coordinator/src/main/resources/common/message/TransactionLogKey.json` and
//! `TransactionLogValue.json`), so that `kafka-dump-log --transaction-log-decoder` reads what
//! gregor writes and gregor loads what Kafka wrote.
//!
//! - Key: int16 version (0), then `TransactionalId` as a STRING. Never flexible.
//! - Value: int16 version, then `TransactionLogValue`. Version 0 is not flexible; version 1
//!   (written when `transaction.version` >= 1 is finalized, as Kafka 4's
//!   `TransactionVersion.transactionLogValueVersion`) is flexible (KIP-482): compact strings
//!   and arrays, and the tagged fields `PreviousProducerId` (tag 0), `NextProducerId` (tag 1)
//!   and `ClientTransactionVersion` (tag 2), each omitted at its default.
//! - A null value (tombstone) removes the transactional id (`transactional.id.expiration.ms`).
//!
//! `TransactionPartitions` is null for the Empty state, as Kafka writes it.

use gregor_protocol::wire::{Reader, WireError, Writer};

use super::state::TransactionState;

/// `TransactionLogKey` version.
pub const TRANSACTION_LOG_KEY_VERSION: i16 = 0;
/// The highest `TransactionLogValue` version (flexible).
pub const TRANSACTION_LOG_VALUE_VERSION: i16 = 1;

/// A decoded `TransactionLogValue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionLogValue {
    /// Producer id in use by the transactional id.
    pub producer_id: i64,
    /// Producer id used by the last committed transaction (v1 tagged, default -1).
    pub previous_producer_id: i64,
    /// The producer id handed to the producer next, when the epoch overflowed (KIP-890,
    /// v1 tagged, default -1).
    pub next_producer_id: i64,
    /// Epoch of the producer id.
    pub producer_epoch: i16,
    /// `transaction.timeout.ms` of the producer.
    pub transaction_timeout_ms: i32,
    /// The state.
    pub state: TransactionState,
    /// The partitions in the transaction: (topic, partitions). Empty for Empty (written null).
    pub partitions: Vec<(String, Vec<i32>)>,
    /// Last update (ms).
    pub last_update_timestamp_ms: i64,
    /// Start of the transaction (ms), -1 when none.
    pub start_timestamp_ms: i64,
    /// `transaction.version` the client used (v1 tagged, default 0).
    pub client_transaction_version: i16,
}

/// A decoded key of `__transaction_state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransactionLogKey {
    /// `TransactionLogKey` v0.
    Transaction {
        /// The transactional id.
        transactional_id: String,
    },
    /// A key version gregor (and Kafka) does not know; skipped on load.
    Unknown(i16),
}

/// `TransactionLogKey` bytes.
pub fn key(transactional_id: &str) -> Vec<u8> {
    let mut w = Writer::with_capacity(4 + transactional_id.len());
    w.i16(TRANSACTION_LOG_KEY_VERSION);
    w.string(transactional_id);
    w.into_inner()
}

/// Decodes a key.
///
/// # Errors
/// [`WireError`] when a v0 key does not decode.
pub fn decode_key(bytes: &[u8]) -> Result<TransactionLogKey, WireError> {
    let mut r = Reader::new(bytes);
    let version = r.i16("TransactionLogKey version")?;
    if version != TRANSACTION_LOG_KEY_VERSION {
        return Ok(TransactionLogKey::Unknown(version));
    }
    Ok(TransactionLogKey::Transaction {
        transactional_id: r.string("TransactionalId")?,
    })
}

/// `TransactionLogValue` bytes at `version` (0 or 1).
pub fn value(v: &TransactionLogValue, version: i16) -> Vec<u8> {
    let mut w = Writer::with_capacity(64);
    let flexible = version >= 1;
    w.i16(if flexible { 1 } else { 0 });
    w.i64(v.producer_id);
    w.i16(v.producer_epoch);
    w.i32(v.transaction_timeout_ms);
    w.i8(v.state.id());
    let null_partitions = v.state == TransactionState::Empty;
    if flexible {
        if null_partitions {
            w.compact_null();
        } else {
            w.compact_len(v.partitions.len());
            for (topic, ids) in &v.partitions {
                w.compact_string(topic);
                w.compact_len(ids.len());
                for p in ids {
                    w.i32(*p);
                }
                w.no_tagged_fields();
            }
        }
    } else if null_partitions {
        w.i32(-1);
    } else {
        w.array_len(v.partitions.len());
        for (topic, ids) in &v.partitions {
            w.string(topic);
            w.array_len(ids.len());
            for p in ids {
                w.i32(*p);
            }
        }
    }
    w.i64(v.last_update_timestamp_ms);
    w.i64(v.start_timestamp_ms);
    if flexible {
        let prev = v.previous_producer_id.to_be_bytes();
        let next = v.next_producer_id.to_be_bytes();
        let tv = v.client_transaction_version.to_be_bytes();
        let mut tagged: Vec<(u32, &[u8])> = Vec::new();
        if v.previous_producer_id != -1 {
            tagged.push((0, &prev));
        }
        if v.next_producer_id != -1 {
            tagged.push((1, &next));
        }
        if v.client_transaction_version != 0 {
            tagged.push((2, &tv));
        }
        w.tagged_fields(&tagged);
    }
    w.into_inner()
}

/// Decodes a value (v0 or v1).
///
/// # Errors
/// [`WireError`] for an unknown version or state, or bytes that do not follow the schema.
pub fn decode_value(bytes: &[u8]) -> Result<TransactionLogValue, WireError> {
    let mut r = Reader::new(bytes);
    let version = r.i16("TransactionLogValue version")?;
    if !(0..=TRANSACTION_LOG_VALUE_VERSION).contains(&version) {
        return Err(WireError::Invalid("TransactionLogValue version"));
    }
    let flexible = version >= 1;
    let producer_id = r.i64("ProducerId")?;
    let producer_epoch = r.i16("ProducerEpoch")?;
    let transaction_timeout_ms = r.i32("TransactionTimeoutMs")?;
    let state = TransactionState::from_id(r.i8("TransactionStatus")?)
        .ok_or(WireError::Invalid("TransactionStatus"))?;
    let mut partitions = Vec::new();
    // A topic takes at least 2 bytes (name length) and its partition array 1 or 4.
    let count = if flexible {
        r.compact_len("TransactionPartitions", 3)?
    } else {
        r.array_len("TransactionPartitions", 6)?
    };
    for _ in 0..count.unwrap_or(0) {
        let topic = if flexible {
            r.compact_string("Topic")?
        } else {
            r.string("Topic")?
        };
        let n = if flexible {
            r.compact_len("PartitionIds", 4)?
        } else {
            r.array_len("PartitionIds", 4)?
        }
        .ok_or(WireError::Invalid("PartitionIds"))?;
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            ids.push(r.i32("PartitionId")?);
        }
        if flexible {
            r.skip_tagged_fields()?;
        }
        partitions.push((topic, ids));
    }
    let last_update_timestamp_ms = r.i64("TransactionLastUpdateTimestampMs")?;
    let start_timestamp_ms = r.i64("TransactionStartTimestampMs")?;
    let mut previous_producer_id = -1;
    let mut next_producer_id = -1;
    let mut client_transaction_version = 0;
    if flexible {
        r.tagged_fields(|tag, data| {
            let mut f = Reader::new(data);
            match tag {
                0 => previous_producer_id = f.i64("PreviousProducerId")?,
                1 => next_producer_id = f.i64("NextProducerId")?,
                2 => client_transaction_version = f.i16("ClientTransactionVersion")?,
                _ => {}
            }
            Ok(())
        })?;
    }
    Ok(TransactionLogValue {
        producer_id,
        previous_producer_id,
        next_producer_id,
        producer_epoch,
        transaction_timeout_ms,
        state,
        partitions,
        last_update_timestamp_ms,
        start_timestamp_ms,
        client_transaction_version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample(state: TransactionState) -> TransactionLogValue {
        TransactionLogValue {
            producer_id: 4000,
            previous_producer_id: -1,
            next_producer_id: -1,
            producer_epoch: 3,
            transaction_timeout_ms: 60_000,
            state,
            partitions: if state == TransactionState::Empty {
                vec![]
            } else {
                vec![("t".into(), vec![0, 2])]
            },
            last_update_timestamp_ms: 1_700_000_000_000,
            start_timestamp_ms: 1_699_999_999_000,
            client_transaction_version: 0,
        }
    }

    /// The exact bytes of Kafka's generated `TransactionLogValue` writer (the schema's field
    /// order and types, written out by hand from the JSON): v0 Ongoing with one topic.
    #[test]
    fn v0_bytes_follow_the_schema() {
        let b = value(&sample(TransactionState::Ongoing), 0);
        let mut want = vec![0, 0]; // version 0
        want.extend_from_slice(&4000i64.to_be_bytes());
        want.extend_from_slice(&3i16.to_be_bytes());
        want.extend_from_slice(&60_000i32.to_be_bytes());
        want.push(1); // Ongoing
        want.extend_from_slice(&1i32.to_be_bytes()); // one topic
        want.extend_from_slice(&[0, 1, b't']);
        want.extend_from_slice(&2i32.to_be_bytes());
        want.extend_from_slice(&0i32.to_be_bytes());
        want.extend_from_slice(&2i32.to_be_bytes());
        want.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
        want.extend_from_slice(&1_699_999_999_000i64.to_be_bytes());
        assert_eq!(b, want);
        // Empty writes a null partition array.
        let e = value(&sample(TransactionState::Empty), 0);
        assert_eq!(&e[17..21], &(-1i32).to_be_bytes());
    }

    #[test]
    fn v1_bytes_follow_the_schema() {
        let mut v = sample(TransactionState::PrepareCommit);
        v.previous_producer_id = 7;
        v.client_transaction_version = 2;
        let b = value(&v, 1);
        let mut want = vec![0, 1];
        want.extend_from_slice(&4000i64.to_be_bytes());
        want.extend_from_slice(&3i16.to_be_bytes());
        want.extend_from_slice(&60_000i32.to_be_bytes());
        want.push(2); // PrepareCommit
        want.push(2); // compact array of 1
        want.extend_from_slice(&[2, b't']); // compact string
        want.push(3); // compact array of 2
        want.extend_from_slice(&0i32.to_be_bytes());
        want.extend_from_slice(&2i32.to_be_bytes());
        want.push(0); // the topic's tagged fields
        want.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
        want.extend_from_slice(&1_699_999_999_000i64.to_be_bytes());
        want.push(2); // two tagged fields
        want.extend_from_slice(&[0, 8]);
        want.extend_from_slice(&7i64.to_be_bytes());
        want.extend_from_slice(&[2, 2]);
        want.extend_from_slice(&2i16.to_be_bytes());
        assert_eq!(b, want);
        assert_eq!(decode_value(&b).unwrap(), v);
        // Empty in v1: a null compact array (0).
        let e = value(&sample(TransactionState::Empty), 1);
        assert_eq!(e[17], 0);
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The bytes Apache Kafka 4.4's own generated `TransactionLogKey`/`TransactionLogValue`
    /// write (printed by `interop/java/txn-log-vectors/TxnLogVectors.java` from the jars):
    /// gregor decodes them to the same fields and encodes those fields to the same bytes.
    #[test]
    fn kafkas_own_bytes() {
        assert_eq!(key("my-txn"), unhex("000000066d792d74786e"));
        let parts = vec![
            ("t".to_string(), vec![0, 2]),
            ("__consumer_offsets".to_string(), vec![49]),
        ];
        let ongoing = TransactionLogValue {
            partitions: parts.clone(),
            ..sample(TransactionState::Ongoing)
        };
        let kafka = unhex("00000000000000000fa000030000ea60010000000200017400000002000000000000000200125f5f636f6e73756d65725f6f66667365747300000001000000310000018bcfe568000000018bcfe56418");
        assert_eq!(decode_value(&kafka).unwrap(), ongoing);
        assert_eq!(value(&ongoing, 0), kafka);
        let kafka =
            unhex("00000000000000000fa000030000ea6000ffffffff0000018bcfe568000000018bcfe56418");
        assert_eq!(
            decode_value(&kafka).unwrap(),
            sample(TransactionState::Empty)
        );
        assert_eq!(value(&sample(TransactionState::Empty), 0), kafka);
        let tagged = TransactionLogValue {
            partitions: parts,
            previous_producer_id: 7,
            next_producer_id: 8,
            client_transaction_version: 2,
            ..sample(TransactionState::PrepareCommit)
        };
        let kafka = unhex("00010000000000000fa000030000ea600203027403000000000000000200135f5f636f6e73756d65725f6f6666736574730200000031000000018bcfe568000000018bcfe5641803000800000000000000070108000000000000000802020002");
        assert_eq!(decode_value(&kafka).unwrap(), tagged);
        assert_eq!(value(&tagged, 1), kafka);
        let kafka = unhex("00010000000000000fa000030000ea6000000000018bcfe568000000018bcfe5641800");
        assert_eq!(
            decode_value(&kafka).unwrap(),
            sample(TransactionState::Empty)
        );
        assert_eq!(value(&sample(TransactionState::Empty), 1), kafka);
    }

    #[test]
    fn keys_round_trip_and_unknown_versions_are_skipped() {
        let k = key("my-txn");
        assert_eq!(k, [0, 0, 0, 6, b'm', b'y', b'-', b't', b'x', b'n']);
        assert_eq!(
            decode_key(&k).unwrap(),
            TransactionLogKey::Transaction {
                transactional_id: "my-txn".into()
            }
        );
        assert_eq!(decode_key(&[0, 9]).unwrap(), TransactionLogKey::Unknown(9));
        assert!(decode_key(&[0]).is_err());
    }

    #[test]
    fn bad_values_are_errors_not_panics() {
        assert!(decode_value(&[0, 2]).is_err());
        let mut b = value(&sample(TransactionState::Ongoing), 0);
        b[16] = 42; // unknown state
        assert!(decode_value(&b).is_err());
        // A partition count far beyond the bytes present.
        let mut b = value(&sample(TransactionState::Ongoing), 0);
        b[17..21].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(decode_value(&b).is_err());
    }

    fn any_state() -> impl Strategy<Value = TransactionState> {
        (0i8..=7).prop_map(|i| TransactionState::from_id(i).unwrap())
    }

    proptest! {
        #[test]
        fn values_round_trip(
            version in 0i16..=1,
            producer_id in any::<i64>(),
            prev in prop_oneof![Just(-1i64), any::<i64>()],
            next in prop_oneof![Just(-1i64), any::<i64>()],
            epoch in any::<i16>(),
            timeout in any::<i32>(),
            state in any_state(),
            parts in proptest::collection::vec(("[a-z._-]{1,20}", proptest::collection::vec(any::<i32>(), 0..5)), 0..4),
            updated in any::<i64>(),
            started in any::<i64>(),
            tv in 0i16..=2,
        ) {
            let v = TransactionLogValue {
                producer_id,
                previous_producer_id: if version == 1 { prev } else { -1 },
                next_producer_id: if version == 1 { next } else { -1 },
                producer_epoch: epoch,
                transaction_timeout_ms: timeout,
                state,
                partitions: if state == TransactionState::Empty { vec![] } else { parts },
                last_update_timestamp_ms: updated,
                start_timestamp_ms: started,
                client_transaction_version: if version == 1 { tv } else { 0 },
            };
            prop_assert_eq!(decode_value(&value(&v, version)).unwrap(), v);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_value(&bytes);
            let _ = decode_key(&bytes);
        }
    }
}
