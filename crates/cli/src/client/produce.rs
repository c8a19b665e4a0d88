//! `gregor produce TOPIC`: one record per input line, from stdin or `--file`; waits for every
//! delivery report and fails if any record was not acknowledged.

use super::{parse_key_value, ConnectionArgs, Output};
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Message};
use serde_json::json;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// At most this many delivery errors are kept for the report; the rest are only counted.
const MAX_REPORTED_ERRORS: usize = 10;

#[derive(clap::Args, Debug)]
pub struct ProduceArgs {
    /// Topic to produce to.
    topic: String,
    #[command(flatten)]
    pub(super) connection: ConnectionArgs,
    /// Read lines from this file instead of stdin (shows a progress bar).
    #[arg(long, short = 'f')]
    file: Option<PathBuf>,
    /// Split each line into key and value at the first occurrence of SEP.
    #[arg(long, value_name = "SEP")]
    key_separator: Option<String>,
    /// Compression codec of produced batches.
    #[arg(long, value_enum, default_value_t = Compression::None)]
    compression: Compression,
    /// Acknowledgements the leader must receive before answering.
    #[arg(long, value_enum, default_value_t = Acks::All)]
    acks: Acks,
    /// Produce every record to this partition (default: the partitioner picks).
    #[arg(long, short = 'p')]
    partition: Option<i32>,
    /// Header added to every record. Repeatable.
    #[arg(long = "header", short = 'H', value_name = "KEY=VALUE", value_parser = parse_key_value)]
    headers: Vec<(String, String)>,
    /// Give up on a record not acknowledged within this time (message.timeout.ms).
    #[arg(long, default_value_t = 30_000)]
    delivery_timeout_ms: u64,
    /// How to print the summary.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Compression {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Compression {
    fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Gzip => "gzip",
            Self::Snappy => "snappy",
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        }
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Acks {
    #[value(name = "0")]
    Zero,
    #[value(name = "1")]
    One,
    #[value(name = "all", alias = "-1")]
    All,
}

impl Acks {
    fn as_str(self) -> &'static str {
        match self {
            Self::Zero => "0",
            Self::One => "1",
            Self::All => "all",
        }
    }
}

/// Counts delivery reports; librdkafka calls it from `poll`/`flush` on this thread.
#[derive(Default)]
struct DeliveryTracker {
    delivered: AtomicU64,
    failed: AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl ClientContext for DeliveryTracker {}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = Box<u64>;

    fn delivery(&self, result: &DeliveryResult<'_>, line_number: Box<u64>) {
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err((err, msg)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                let mut errors = self
                    .errors
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if errors.len() < MAX_REPORTED_ERRORS {
                    errors.push(format!(
                        "line {line_number} (partition {}): {err}",
                        msg.partition()
                    ));
                }
            }
        }
    }
}

/// Set by Ctrl-C or SIGTERM: stop reading input, wait for what was sent, report.
static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub async fn run(args: ProduceArgs) -> Result<()> {
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = sigterm.recv() => {}
        }
        STOP.store(true, Ordering::Relaxed);
    });
    // librdkafka's producer API is blocking; keep it off the async workers.
    tokio::task::spawn_blocking(move || produce(&args)).await?
}

fn produce(args: &ProduceArgs) -> Result<()> {
    let timeout_ms = args.delivery_timeout_ms.to_string();
    let producer: BaseProducer<DeliveryTracker> = args
        .connection
        .client_config(&[
            ("acks", args.acks.as_str()),
            ("compression.type", args.compression.as_str()),
            ("message.timeout.ms", &timeout_ms),
            ("linger.ms", "5"),
        ])
        .create_with_context(DeliveryTracker::default())
        .context("creating the producer")?;

    let (reader, progress): (Box<dyn BufRead>, Option<ProgressBar>) = match &args.file {
        Some(path) => {
            let file =
                std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
            let len = file.metadata().map(|m| m.len()).unwrap_or(0);
            let bar = ProgressBar::new(len);
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] [{bar:40}] {bytes}/{total_bytes} {msg}",
                )?
                .progress_chars("=> "),
            );
            (Box::new(BufReader::new(bar.wrap_read(file))), Some(bar))
        }
        None => (Box::new(BufReader::new(std::io::stdin())), None),
    };

    let headers = args.headers.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
        h.insert(Header {
            key: k,
            value: Some(v.as_bytes()),
        })
    });
    let mut sent: u64 = 0;
    let read_result = send_lines(
        reader,
        args,
        &producer,
        &headers,
        &mut sent,
        progress.as_ref(),
    );

    // Whatever happened to the input, wait for what was already handed to librdkafka: its
    // delivery timeout (message.timeout.ms) bounds the wait.
    let flush_result = producer.flush(Duration::from_millis(args.delivery_timeout_ms + 5_000));
    if let Some(bar) = &progress {
        bar.finish_and_clear();
    }
    let ctx = producer.context();
    let delivered = ctx.delivered.load(Ordering::Relaxed);
    let failed = ctx.failed.load(Ordering::Relaxed);
    let unacknowledged = sent.saturating_sub(delivered + failed);
    let errors = ctx
        .errors
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    match args.output {
        Output::Json => println!(
            "{}",
            json!({
                "topic": args.topic,
                "sent": sent,
                "delivered": delivered,
                "failed": failed + unacknowledged,
                "errors": errors,
            })
        ),
        Output::Table => eprintln!("Produced {delivered} of {sent} records to {}.", args.topic),
    }
    for e in &errors {
        eprintln!("delivery failed: {e}");
    }
    // The summary above is printed first, so an input error or a stop at a failed delivery
    // still says what was acknowledged.
    read_result?;
    if let Err(e) = flush_result {
        bail!("{unacknowledged} records still unacknowledged after the flush: {e}");
    }
    if failed + unacknowledged > 0 {
        bail!(
            "{} of {sent} records were not delivered",
            failed + unacknowledged
        );
    }
    Ok(())
}

fn send_lines(
    reader: Box<dyn BufRead>,
    args: &ProduceArgs,
    producer: &BaseProducer<DeliveryTracker>,
    headers: &OwnedHeaders,
    sent: &mut u64,
    progress: Option<&ProgressBar>,
) -> Result<()> {
    let mut line = Vec::new();
    let mut reader = reader;
    let mut line_number: u64 = 0;
    loop {
        if STOP.load(Ordering::Relaxed) {
            eprintln!("interrupted: no more input is read; waiting for the records already sent");
            return Ok(());
        }
        if producer.context().failed.load(Ordering::Relaxed) > 0 {
            // Stop at the first failure, and drop what is still queued locally, so the topic
            // never gets a hole followed by later lines.
            producer.purge(rdkafka::producer::PurgeConfig::default().queue());
            bail!(
                "a record was not delivered; stopped after line {line_number} (later lines were not sent)"
            );
        }
        line.clear();
        let n = reader
            .by_ref()
            .read_until(b'\n', &mut line)
            .context("reading input")?;
        if n == 0 {
            return Ok(());
        }
        line_number += 1;
        if line.last() == Some(&b'\n') {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
        }
        let (key, value): (Option<&[u8]>, &[u8]) = match &args.key_separator {
            Some(sep) => match find(&line, sep.as_bytes()) {
                Some(at) => (Some(&line[..at]), &line[at + sep.len()..]),
                None => bail!("no key separator {sep:?} on line {line_number}"),
            },
            None => (None, &line[..]),
        };
        let mut record: BaseRecord<'_, [u8], [u8], Box<u64>> =
            BaseRecord::with_opaque_to(&args.topic, Box::new(line_number))
                .payload(value)
                .headers(headers.clone());
        if let Some(key) = key {
            record = record.key(key);
        }
        if let Some(p) = args.partition {
            record = record.partition(p);
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    // Serve delivery reports until the local queue has room again.
                    record = back;
                    producer.poll(Duration::from_millis(100));
                    if STOP.load(Ordering::Relaxed)
                        || producer.context().failed.load(Ordering::Relaxed) > 0
                    {
                        // This line was not sent; the summary reports what was.
                        return Ok(());
                    }
                }
                Err((e, _)) => {
                    return Err(e).with_context(|| format!("producing line {line_number}"));
                }
            }
        }
        *sent += 1;
        producer.poll(Duration::ZERO);
        if let Some(bar) = progress {
            if line_number & 1023 == 0 {
                bar.set_message(format!("{sent} records"));
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::find;

    #[test]
    fn separator_found_at_first_occurrence() {
        assert_eq!(find(b"k::v::w", b"::"), Some(1));
        assert_eq!(find(b"kv", b":"), None);
    }
}
