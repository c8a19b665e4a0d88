//! An inactive segment's `.index` that passes every sanity check but points a few bytes off
//! (gregor issue 14, finding F1), seen through librdkafka: after a restart a consumer reads
//! every record and ListOffsets by timestamp answers right, the segment's index having been
//! rebuilt once (`gregor_log_index_rebuilds_total`, a warning naming it).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use gregor_tests::{clients, Gregor};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const TOPIC: &str = "heal";
/// Records of about 300 bytes: a few 1 MiB segments.
const RECORDS: i64 = 12_000;
const T0_MS: i64 = 1_700_000_000_000;

fn value(i: i64) -> Vec<u8> {
    let mut v = format!("record {i} ").into_bytes();
    v.resize(300, b'x');
    v
}

fn partition_dir(data: &Path) -> Result<PathBuf> {
    let dir = data.join(format!("{TOPIC}-0"));
    ensure!(dir.is_dir(), "{} missing", dir.display());
    Ok(dir)
}

/// Adds 61 to the positions of the middle third of the entries (still increasing and inside
/// the segment, the last one untouched).
fn shift_offset_index(path: &Path) -> Result<()> {
    let mut b = std::fs::read(path)?;
    let n = b.len() / 8;
    ensure!(n >= 6, "{} holds {n} entries", path.display());
    for e in b.chunks_exact_mut(8).take(2 * n / 3).skip(n / 3) {
        let pos = u32::from_be_bytes([e[4], e[5], e[6], e[7]]) + 61;
        e[4..8].copy_from_slice(&pos.to_be_bytes());
    }
    std::fs::write(path, b)?;
    Ok(())
}

#[test]
fn a_consumer_and_list_offsets_read_right_through_a_misleading_index() -> Result<()> {
    let mut g = Gregor::start(BIN, &["log.segment.bytes=1048576"])?;
    let bootstrap = g.bootstrap();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in clients::runtime()?.block_on(clients::admin(&bootstrap)?.create_topics(
        &[NewTopic::new(TOPIC, 1, TopicReplication::Fixed(1))],
        &opts,
    ))? {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    let producer = clients::producer(&bootstrap, &[("batch.size", "4000"), ("linger.ms", "1")])?;
    for i in 0..RECORDS {
        let v = value(i);
        let mut record: BaseRecord<'_, (), [u8]> = BaseRecord::to(TOPIC)
            .partition(0)
            .payload(&v[..])
            .timestamp(T0_MS + i * 10);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, r)) => {
                    producer.poll(Duration::from_millis(20));
                    record = r;
                }
            }
        }
    }
    producer.flush(Duration::from_secs(60))?;
    g.stop()?;

    let dir = partition_dir(g.data_dir())?;
    let mut bases: Vec<String> = std::fs::read_dir(&dir)?
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().to_string();
            name.strip_suffix(".log").map(str::to_string)
        })
        .collect();
    bases.sort();
    ensure!(bases.len() >= 3, "segments {bases:?}");
    let index = dir.join(format!("{}.index", bases[1]));
    let original = std::fs::read(&index)?;
    shift_offset_index(&index)?;
    g.restart()?;

    // ListOffsets by timestamp over the damaged segment (and around it).
    let consumer: BaseConsumer = clients::consumer(
        &bootstrap,
        &[("group.id", "index-heal"), ("enable.auto.commit", "false")],
    )?;
    for i in (0..RECORDS).step_by(97) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(TOPIC, 0, Offset::Offset(T0_MS + i * 10))?;
        let got = consumer.offsets_for_times(tpl, Duration::from_secs(10))?;
        let offset = got
            .find_partition(TOPIC, 0)
            .context("no answer for the partition")?
            .offset();
        ensure!(
            offset == Offset::Offset(i),
            "timestamp of record {i}: {offset:?}"
        );
    }
    // Every record, in order, with its value.
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let mut next = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while next < RECORDS {
        if Instant::now() > deadline {
            bail!("read {next} of {RECORDS} records");
        }
        let Some(m) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.context("consuming")?;
        ensure!(m.offset() == next, "offset {} after {next}", m.offset());
        ensure!(
            m.payload() == Some(&value(next)[..]),
            "offset {next}: another value"
        );
        next += 1;
    }

    let (status, body) = g.admin_get("/metrics")?;
    ensure!(status == 200, "/metrics answered {status}");
    let rebuilds = body
        .lines()
        .find_map(|l| {
            l.strip_prefix("gregor_log_index_rebuilds_total ")?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .context("gregor_log_index_rebuilds_total not in /metrics")?;
    ensure!(rebuilds == 1.0, "{rebuilds} index rebuilds");
    ensure!(
        std::fs::read(&index)? == original,
        "the .index file was not rebuilt as it was"
    );
    let log = g.server_log();
    ensure!(
        log.contains("an index entry misled a read") && log.contains(&bases[1]),
        "no warning naming the segment:\n{log}"
    );
    Ok(())
}
