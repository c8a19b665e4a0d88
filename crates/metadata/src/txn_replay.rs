//! Metadata transactions (KIP-868) in replay: records between a `BeginTransactionRecord` and
//! its `EndTransactionRecord` take effect together, and those before an
//! `AbortTransactionRecord` never do.
//!
//! Kafka's controller writes its bootstrap records in a transaction, and a controller that
//! becomes active while a transaction is open (its predecessor failed in the middle of one)
//! aborts it first (Kafka's `ActivationRecordsGenerator`). gregor's controller writes no
//! transactions but shares the log with Kafka's controllers in a mixed cluster, so it replays
//! them as Kafka does: [`TransactionalReplay`] keeps the image from before the open
//! transaction and returns to it on abort. The loader publishes no image while a transaction
//! is open (Kafka's `MetadataBatchLoader`), so brokers, coordinators and snapshots never see
//! a part of one; the controller validates against its image as replayed, and its activation
//! aborts a transaction it finds open ([`TransactionalReplay::open_since`]).

use crate::image::MetadataImage;
use crate::log::CommittedBatch;
use crate::record::MetadataRecord;

/// A transaction whose `BeginTransactionRecord` was replayed and whose end was not.
#[derive(Clone)]
struct OpenTransaction {
    /// Offset of the `BeginTransactionRecord`.
    begin_offset: u64,
    /// The image just before it: what an abort returns to.
    before: MetadataImage,
    /// How many records the caller's `applied` list held then.
    applied_before: usize,
}

/// The transaction state of one replay of the metadata log (the loader's, the controller's).
#[derive(Clone, Default)]
pub struct TransactionalReplay {
    open: Option<OpenTransaction>,
}

/// Whether `record` is one of KIP-868's transaction markers.
pub fn is_transaction_marker(record: &MetadataRecord) -> bool {
    matches!(
        record,
        MetadataRecord::BeginTransaction(_)
            | MetadataRecord::EndTransaction(_)
            | MetadataRecord::AbortTransaction(_)
    )
}

impl TransactionalReplay {
    /// The offset of the open transaction's `BeginTransactionRecord`, if one is open
    /// (Kafka's `transactionStartOffset`).
    pub fn open_since(&self) -> Option<u64> {
        self.open.as_ref().map(|t| t.begin_offset)
    }

    /// The image from before the open transaction, if one is open: what the log holds once
    /// the transaction is aborted.
    pub fn image_before_open(&self) -> Option<&MetadataImage> {
        self.open.as_ref().map(|t| &t.before)
    }

    /// Forgets an open transaction: a snapshot replaced the image (snapshots are taken only
    /// between transactions, so the snapshot holds none of it).
    pub fn reset(&mut self) {
        self.open = None;
    }

    /// Applies `batch` to `image` (whose offset is at or before the batch's base offset), a
    /// record at a time: `each` sees every record that is not a transaction marker with its
    /// offset before it is applied; `applied`, if given, gets those records, and loses those an
    /// abort takes back. Markers out of place (a Begin inside a transaction, an End or Abort
    /// outside one) are logged and ignored, as Kafka's loader reports them to its fault
    /// handler and goes on.
    pub fn replay(
        &mut self,
        image: &mut MetadataImage,
        batch: &CommittedBatch,
        mut applied: Option<&mut Vec<MetadataRecord>>,
        mut each: impl FnMut(u64, &MetadataRecord),
    ) {
        image.offset = image.offset.max(batch.base_offset);
        for record in batch.records.iter() {
            let offset = image.offset;
            match record {
                MetadataRecord::BeginTransaction(r) => {
                    if let Some(open) = &self.open {
                        tracing::error!(
                            offset,
                            open_since = open.begin_offset,
                            "BeginTransactionRecord inside an open metadata transaction; ignored"
                        );
                    } else {
                        self.open = Some(OpenTransaction {
                            begin_offset: offset,
                            before: image.clone(),
                            applied_before: applied.as_ref().map_or(0, |a| a.len()),
                        });
                        tracing::debug!(offset, name = ?r.name, "metadata transaction begins");
                    }
                    image.apply(record);
                }
                MetadataRecord::EndTransaction(_) => {
                    if self.open.take().is_none() {
                        tracing::error!(
                            offset,
                            "EndTransactionRecord without an open metadata transaction; ignored"
                        );
                    }
                    image.apply(record);
                }
                MetadataRecord::AbortTransaction(r) => match self.open.take() {
                    Some(open) => {
                        tracing::info!(
                            offset,
                            begin_offset = open.begin_offset,
                            reason = ?r.reason,
                            "metadata transaction aborted: its records are not applied"
                        );
                        *image = open.before;
                        image.offset = offset + 1;
                        if let Some(a) = applied.as_deref_mut() {
                            a.truncate(open.applied_before);
                        }
                    }
                    None => {
                        tracing::error!(
                            offset,
                            "AbortTransactionRecord without an open metadata transaction; ignored"
                        );
                        image.apply(record);
                    }
                },
                _ => {
                    each(offset, record);
                    image.apply(record);
                    if let Some(a) = applied.as_deref_mut() {
                        a.push(record.clone());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ConfigResource;
    use gregor_protocol::metadata_records::{
        AbortTransactionRecord, BeginTransactionRecord, ConfigRecord, EndTransactionRecord,
    };

    fn config(name: &str) -> MetadataRecord {
        ConfigRecord {
            resource_type: ConfigResource::Broker.resource_type(),
            resource_name: String::new(),
            name: name.into(),
            value: Some("1".into()),
            ..Default::default()
        }
        .into()
    }

    fn begin() -> MetadataRecord {
        BeginTransactionRecord {
            name: Some("Bootstrap records".into()),
            ..Default::default()
        }
        .into()
    }

    fn end() -> MetadataRecord {
        EndTransactionRecord::default().into()
    }

    fn abort() -> MetadataRecord {
        AbortTransactionRecord {
            reason: Some("Controller failover".into()),
            ..Default::default()
        }
        .into()
    }

    fn batch(base_offset: u64, records: Vec<MetadataRecord>) -> CommittedBatch {
        CommittedBatch {
            base_offset,
            epoch: 1,
            records: records.into(),
        }
    }

    fn names(image: &MetadataImage) -> Vec<String> {
        image
            .configs_of(ConfigResource::Broker, "")
            .keys()
            .cloned()
            .collect()
    }

    /// A committed transaction spanning batches takes effect; an aborted one leaves only what
    /// came before it, and the offsets move past both.
    #[test]
    fn committed_records_stay_and_aborted_ones_go() {
        let mut replay = TransactionalReplay::default();
        let mut image = MetadataImage::default();
        let mut applied = Vec::new();
        let mut seen = Vec::new();
        replay.replay(
            &mut image,
            &batch(0, vec![config("a"), begin(), config("b")]),
            Some(&mut applied),
            |o, _| seen.push(o),
        );
        assert_eq!(replay.open_since(), Some(1));
        replay.replay(
            &mut image,
            &batch(3, vec![config("c"), end()]),
            Some(&mut applied),
            |o, _| seen.push(o),
        );
        assert_eq!(replay.open_since(), None);
        assert_eq!(names(&image), ["a", "b", "c"]);
        assert_eq!(image.offset, 5);
        assert_eq!(seen, [0, 2, 3]);

        replay.replay(
            &mut image,
            &batch(6, vec![begin(), config("d")]),
            Some(&mut applied),
            |_, _| {},
        );
        replay.replay(
            &mut image,
            &batch(8, vec![config("e")]),
            Some(&mut applied),
            |_, _| {},
        );
        assert_eq!(names(&image), ["a", "b", "c", "d", "e"]);
        replay.replay(
            &mut image,
            &batch(9, vec![abort(), config("f")]),
            Some(&mut applied),
            |_, _| {},
        );
        assert_eq!(replay.open_since(), None);
        assert_eq!(names(&image), ["a", "b", "c", "f"]);
        assert_eq!(image.offset, 11);
        let applied: Vec<String> = applied
            .iter()
            .map(|r| match r {
                MetadataRecord::Config(c) => c.name.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(applied, ["a", "b", "c", "f"]);
    }

    /// Markers out of place change nothing but the offset.
    #[test]
    fn markers_out_of_place_are_ignored() {
        let mut replay = TransactionalReplay::default();
        let mut image = MetadataImage::default();
        replay.replay(
            &mut image,
            &batch(
                0,
                vec![end(), abort(), config("a"), begin(), begin(), config("b")],
            ),
            None,
            |_, _| {},
        );
        assert_eq!(replay.open_since(), Some(3));
        replay.replay(&mut image, &batch(6, vec![abort()]), None, |_, _| {});
        assert_eq!(names(&image), ["a"]);
        assert_eq!(image.offset, 7);
    }
}
