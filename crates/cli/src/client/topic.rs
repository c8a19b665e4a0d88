//! `gregor topic create|list|describe|delete|delete-records`, through the Admin API
//! (CreateTopics, DeleteTopics, DeleteRecords) and Metadata.

use super::{parse_key_value, ConnectionArgs, Output};
use anyhow::{bail, Context, Result};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::metadata::Metadata;
use serde_json::json;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct TopicArgs {
    #[command(subcommand)]
    command: TopicCommand,
    #[command(flatten)]
    pub(super) connection: ConnectionArgs,
    /// How to print results.
    #[arg(long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    /// Timeout for each admin request, in milliseconds.
    #[arg(long, default_value_t = 30_000, global = true)]
    timeout_ms: u64,
}

#[derive(clap::Subcommand, Debug)]
enum TopicCommand {
    /// Create a topic.
    Create {
        name: String,
        /// Number of partitions (default: the broker's num.partitions).
        #[arg(long, short = 'p')]
        partitions: Option<i32>,
        /// Replication factor (default: the broker's default.replication.factor).
        #[arg(long, short = 'r')]
        replication_factor: Option<i32>,
        /// Topic configuration, e.g. --config cleanup.policy=compact. Repeatable.
        #[arg(long, short = 'c', value_name = "KEY=VALUE", value_parser = parse_key_value)]
        config: Vec<(String, String)>,
    },
    /// List topic names.
    List {
        /// Leave out internal topics (names starting with "__").
        #[arg(long)]
        exclude_internal: bool,
    },
    /// Show partitions, leaders, replicas and ISR of one topic, or of all.
    Describe { name: Option<String> },
    /// Delete a topic.
    Delete { name: String },
    /// Delete the records below an offset (moves the log start offset), as
    /// kafka-delete-records.
    DeleteRecords(super::delete_records::DeleteRecordsArgs),
}

pub async fn run(args: TopicArgs) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = args
        .connection
        .client_config(&[])
        .create()
        .context("creating the admin client")?;
    let timeout = Duration::from_millis(args.timeout_ms);
    let opts = AdminOptions::new()
        .request_timeout(Some(timeout))
        .operation_timeout(Some(timeout));
    match args.command {
        TopicCommand::DeleteRecords(dr) => {
            super::delete_records::run(dr, &admin, &opts, args.output).await?;
        }
        TopicCommand::Create {
            name,
            partitions,
            replication_factor,
            config,
        } => {
            // -1 asks the broker for its defaults (CreateTopics v4+, KIP-464).
            let mut topic = NewTopic::new(
                &name,
                partitions.unwrap_or(-1),
                TopicReplication::Fixed(replication_factor.unwrap_or(-1)),
            );
            for (k, v) in &config {
                topic = topic.set(k, v);
            }
            let results = admin
                .create_topics([&topic], &opts)
                .await
                .with_context(|| format!("creating topic {name}"))?;
            check_results(results, "creating")?;
            match args.output {
                Output::Table => println!("Created topic {name}."),
                Output::Json => println!("{}", json!({ "created": name })),
            }
        }
        TopicCommand::Delete { name } => {
            let results = admin
                .delete_topics(&[&name], &opts)
                .await
                .with_context(|| format!("deleting topic {name}"))?;
            check_results(results, "deleting")?;
            match args.output {
                Output::Table => println!("Deleted topic {name}."),
                Output::Json => println!("{}", json!({ "deleted": name })),
            }
        }
        TopicCommand::List { exclude_internal } => {
            let metadata = fetch_metadata(admin, None, timeout).await?;
            let mut names: Vec<String> = metadata
                .topics()
                .iter()
                .filter(|t| t.error().is_none())
                .map(|t| t.name().to_string())
                .filter(|n| !(exclude_internal && n.starts_with("__")))
                .collect();
            names.sort();
            match args.output {
                Output::Table => names.iter().for_each(|n| println!("{n}")),
                Output::Json => println!("{}", json!(names)),
            }
        }
        TopicCommand::Describe { name } => {
            // Always ask for all topics: a metadata request naming one topic would create it
            // on a broker with auto.create.topics.enable (librdkafka's admin handle allows
            // auto-creation), and describing must never create.
            let metadata = fetch_metadata(admin, None, timeout).await?;
            let mut topics = Vec::new();
            for t in metadata
                .topics()
                .iter()
                .filter(|t| name.as_deref().is_none_or(|n| t.name() == n))
            {
                if let Some(err) = t.error() {
                    let code = rdkafka::types::RDKafkaErrorCode::from(err);
                    bail!("describing topic {}: {code}", t.name());
                }
                let mut partitions: Vec<_> = t
                    .partitions()
                    .iter()
                    .map(|p| PartitionInfo {
                        partition: p.id(),
                        leader: p.leader(),
                        replicas: p.replicas().to_vec(),
                        isr: p.isr().to_vec(),
                        error: p
                            .error()
                            .map(|e| rdkafka::types::RDKafkaErrorCode::from(e).to_string()),
                    })
                    .collect();
                partitions.sort_by_key(|p| p.partition);
                topics.push((t.name().to_string(), partitions));
            }
            topics.sort_by(|a, b| a.0.cmp(&b.0));
            if name.is_some() && topics.is_empty() {
                bail!("topic {} does not exist", name.unwrap_or_default());
            }
            print_describe(&topics, args.output);
        }
    }
    Ok(())
}

struct PartitionInfo {
    partition: i32,
    leader: i32,
    replicas: Vec<i32>,
    isr: Vec<i32>,
    error: Option<String>,
}

fn check_results(results: Vec<rdkafka::admin::TopicResult>, verb: &str) -> Result<()> {
    for result in results {
        if let Err((topic, code)) = result {
            bail!("{verb} topic {topic}: {code}");
        }
    }
    Ok(())
}

/// Metadata is a blocking librdkafka call: run it off the async workers.
async fn fetch_metadata(
    admin: AdminClient<DefaultClientContext>,
    topic: Option<String>,
    timeout: Duration,
) -> Result<Metadata> {
    tokio::task::spawn_blocking(move || {
        admin
            .inner()
            .fetch_metadata(topic.as_deref(), timeout)
            .context("fetching metadata")
    })
    .await?
}

fn ids(ids: &[i32]) -> String {
    ids.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
}

fn print_describe(topics: &[(String, Vec<PartitionInfo>)], output: Output) {
    match output {
        Output::Json => {
            let value: Vec<_> = topics
                .iter()
                .map(|(name, partitions)| {
                    json!({
                        "name": name,
                        "partition_count": partitions.len(),
                        "partitions": partitions.iter().map(|p| json!({
                            "partition": p.partition,
                            "leader": p.leader,
                            "replicas": p.replicas,
                            "isr": p.isr,
                            "error": p.error,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            println!("{}", serde_json::Value::Array(value));
        }
        Output::Table => {
            let mut table = Table::new();
            table.load_preset(UTF8_FULL_CONDENSED);
            table.set_header(["Topic", "Partition", "Leader", "Replicas", "ISR", "Error"]);
            for (name, partitions) in topics {
                for p in partitions {
                    table.add_row([
                        name.clone(),
                        p.partition.to_string(),
                        p.leader.to_string(),
                        ids(&p.replicas),
                        ids(&p.isr),
                        p.error.clone().unwrap_or_default(),
                    ]);
                }
            }
            println!("{table}");
        }
    }
}
