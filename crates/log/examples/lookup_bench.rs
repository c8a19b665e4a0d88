//! A one-off measurement of the fetch hot path (not a test): a partition log of many small
//! batches over several segments, then random reads by offset (a fetch of one batch each) and
//! random ListOffsets-by-timestamp lookups, timed. Run with
//! `cargo run --release -p gregor-log --example lookup_bench -- [batches] [reads] [rounds]`.

use std::time::Instant;

use gregor_log::{LogConfig, PartitionLog, TopicPartition};
use gregor_protocol::batch::BatchBuilder;

const NOW_MS: i64 = 1_700_000_000_000;

/// xorshift64*: a fixed, reproducible sequence of lookups.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .map_or(default, |a| a.parse().expect("a number"))
}

fn main() {
    let (batches, reads, rounds) = (arg(1, 100_000), arg(2, 1_000_000), arg(3, 3));
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = LogConfig {
        segment_bytes: 1 << 20,
        ..LogConfig::default()
    };
    let log = PartitionLog::open(dir.path(), TopicPartition::new("t", 0), config, true)
        .expect("the log opens");
    for i in 0..batches as i64 {
        let ts = NOW_MS + i;
        let mut b = BatchBuilder::new(0, ts).record(ts, Some(b"k"), Some(&[b'v'; 8]), &[]);
        if i % 2 == 1 {
            b = b.record(ts, None, Some(&[b'w'; 8]), &[]);
        }
        log.append_as_leader(&mut b.build(), 0, NOW_MS)
            .expect("the append succeeds");
    }
    let end = log.log_end_offset();
    println!(
        "{batches} batches, offsets 0..{end}, {} segments",
        log.num_segments()
    );
    for round in 0..rounds {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 + round);
        let mut bytes = 0usize;
        let t = Instant::now();
        for _ in 0..reads {
            let at = rng.below(end as u64) as i64;
            let r = log.read(at, 1, end, true).expect("the read succeeds");
            bytes += r.records.len();
        }
        let fetch = t.elapsed();
        let t = Instant::now();
        let mut found = 0;
        for _ in 0..reads / 5 {
            let at = NOW_MS + rng.below(batches) as i64;
            let r = log
                .fetch_offset_by_timestamp(at)
                .expect("the lookup succeeds");
            found += usize::from(r.is_some());
        }
        let times = t.elapsed();
        println!(
            "round {round}: {reads} reads {:.0} ns/read ({bytes} bytes); {} timestamp lookups \
             {:.0} ns/lookup ({found} found)",
            fetch.as_nanos() as f64 / reads as f64,
            reads / 5,
            times.as_nanos() as f64 / (reads / 5) as f64,
        );
    }
}
