//! `gregor topic delete-records TOPIC --partition P --before OFFSET`: DeleteRecords, as
//! `kafka-delete-records`. Moves the log start offset up to OFFSET; the records below it are
//! no longer readable and their segments are deleted by the next retention run.

use super::Output;
use anyhow::{bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;

#[derive(clap::Args, Debug)]
pub struct DeleteRecordsArgs {
    /// Topic to delete records from.
    topic: String,
    /// Partition(s) to delete records from. Repeatable.
    #[arg(long, short = 'p', required = true)]
    partition: Vec<i32>,
    /// Delete every record below this offset; `end` (or `latest`) deletes them all.
    #[arg(long, value_name = "OFFSET", value_parser = parse_before)]
    before: Offset,
}

fn parse_before(s: &str) -> Result<Offset> {
    match s {
        "end" | "latest" => Ok(Offset::End),
        n => match n.parse::<i64>() {
            Ok(n) if n >= 0 => Ok(Offset::Offset(n)),
            _ => bail!("--before must be a non-negative offset or `end`, got {s:?}"),
        },
    }
}

pub async fn run(
    args: DeleteRecordsArgs,
    admin: &AdminClient<DefaultClientContext>,
    opts: &AdminOptions,
    output: Output,
) -> Result<()> {
    let mut tpl = TopicPartitionList::new();
    for p in &args.partition {
        tpl.add_partition_offset(&args.topic, *p, args.before)
            .with_context(|| format!("adding {}-{p}", args.topic))?;
    }
    let result = admin
        .delete_records(&tpl, opts)
        .await
        .with_context(|| format!("deleting records of {}", args.topic))?;
    let mut rows = Vec::new();
    for e in result.elements() {
        let name = format!("{}-{}", e.topic(), e.partition());
        if let Err(err) = e.error() {
            let hint = if err.rdkafka_error_code()
                == Some(rdkafka::types::RDKafkaErrorCode::OffsetOutOfRange)
            {
                " (--before is above the partition's high watermark; `--before end` deletes everything)"
            } else {
                ""
            };
            bail!("deleting records of {name}: {err}{hint}");
        }
        let low_watermark = match e.offset() {
            Offset::Offset(o) => o,
            other => bail!("deleting records of {name}: unexpected low watermark {other:?}"),
        };
        rows.push((e.topic().to_string(), e.partition(), low_watermark));
    }
    rows.sort();
    match output {
        Output::Table => {
            println!("Records delete operation completed:");
            for (t, p, low) in &rows {
                println!("partition: {t}-{p}\tlow_watermark: {low}");
            }
        }
        Output::Json => {
            let value: Vec<_> = rows
                .iter()
                .map(|(t, p, low)| json!({"topic": t, "partition": p, "low_watermark": low}))
                .collect();
            println!("{}", serde_json::Value::Array(value));
        }
    }
    Ok(())
}
