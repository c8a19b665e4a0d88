//! `gregor config describe|set|delete` for a topic or a broker, modelled on `kafka-configs`.
//!
//! rdkafka 0.39 wraps DescribeConfigs and the legacy AlterConfigs, not
//! IncrementalAlterConfigs. AlterConfigs replaces every dynamic value of the resource, so
//! `set` and `delete` first describe the resource, keep its dynamic values (source
//! DYNAMIC_TOPIC_CONFIG for a topic, DYNAMIC_BROKER_CONFIG for a broker), apply the change,
//! and send the whole set. Two concurrent changes to one resource can therefore lose one of
//! them, as with `kafka-configs` before KIP-339.

use super::{parse_key_value, ConnectionArgs, Output};
use anyhow::{bail, Context, Result};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, ConfigEntry, ConfigResource, ConfigSource,
    ResourceSpecifier,
};
use rdkafka::client::DefaultClientContext;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
    #[command(flatten)]
    pub(super) connection: ConnectionArgs,
    /// How to print results.
    #[arg(long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    /// Timeout for each admin request, in milliseconds.
    #[arg(long, default_value_t = 30_000, global = true)]
    timeout_ms: u64,
}

/// Which resource: `--topic NAME` or `--broker ID`.
#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
struct Entity {
    /// A topic.
    #[arg(long)]
    topic: Option<String>,
    /// A broker, by node id.
    #[arg(long)]
    broker: Option<i32>,
}

impl Entity {
    fn specifier(&self) -> Result<ResourceSpecifier<'_>> {
        match (&self.topic, self.broker) {
            (Some(t), None) => Ok(ResourceSpecifier::Topic(t)),
            (None, Some(b)) => Ok(ResourceSpecifier::Broker(b)),
            _ => bail!("give exactly one of --topic and --broker"),
        }
    }

    /// `topic orders` / `broker 1`, as kafka-configs words it.
    fn describe(&self) -> String {
        match (&self.topic, self.broker) {
            (Some(t), _) => format!("topic {t}"),
            (None, Some(b)) => format!("broker {b}"),
            (None, None) => String::new(),
        }
    }

    /// The source of values set on this resource itself.
    fn own_source(&self) -> ConfigSource {
        if self.topic.is_some() {
            ConfigSource::DynamicTopic
        } else {
            ConfigSource::DynamicBroker
        }
    }
}

#[derive(clap::Subcommand, Debug)]
enum ConfigCommand {
    /// Show the dynamic configs of a topic or broker (with --all: every config).
    Describe {
        #[command(flatten)]
        entity: Entity,
        /// Every config, including static values and defaults.
        #[arg(long)]
        all: bool,
    },
    /// Set configs; other dynamic configs of the resource are kept.
    Set {
        #[command(flatten)]
        entity: Entity,
        /// KEY=VALUE, one or more.
        #[arg(required = true, value_name = "KEY=VALUE", value_parser = parse_key_value)]
        configs: Vec<(String, String)>,
    },
    /// Remove dynamic configs, so the resource falls back to the broker or default value.
    Delete {
        #[command(flatten)]
        entity: Entity,
        /// Config names, one or more.
        #[arg(required = true, value_name = "KEY")]
        keys: Vec<String>,
    },
}

pub async fn run(args: ConfigArgs) -> Result<()> {
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
        ConfigCommand::Describe { entity, all } => {
            let resource = describe(&admin, &entity, &opts).await?;
            let entries: Vec<&ConfigEntry> = resource
                .entries
                .iter()
                .filter(|e| {
                    all || !matches!(e.source, ConfigSource::Default | ConfigSource::StaticBroker)
                })
                .collect();
            print_entries(&entity, &entries, all, args.output);
        }
        ConfigCommand::Set { entity, configs } => {
            let resource = describe(&admin, &entity, &opts).await?;
            let mut values = own_values(&entity, &resource);
            for (k, v) in configs {
                values.insert(k, Some(v));
            }
            alter(&admin, &entity, &values, &opts).await?;
            print_done(&entity, args.output);
        }
        ConfigCommand::Delete { entity, keys } => {
            let resource = describe(&admin, &entity, &opts).await?;
            let unknown: Vec<&str> = keys
                .iter()
                .filter(|k| resource.get(k).is_none())
                .map(String::as_str)
                .collect();
            if !unknown.is_empty() {
                bail!("Invalid config(s): {}", unknown.join(","));
            }
            let mut values = own_values(&entity, &resource);
            for k in &keys {
                values.remove(k);
            }
            alter(&admin, &entity, &values, &opts).await?;
            print_done(&entity, args.output);
        }
    }
    Ok(())
}

async fn describe(
    admin: &AdminClient<DefaultClientContext>,
    entity: &Entity,
    opts: &AdminOptions,
) -> Result<ConfigResource> {
    let spec = entity.specifier()?;
    let what = entity.describe();
    let mut results = admin
        .describe_configs([&spec], opts)
        .await
        .with_context(|| format!("describing the configs of {what}"))?;
    match results.pop() {
        // rdkafka 0.39 drops DescribeConfigs' per-resource errors too: an unknown topic or
        // broker comes back as a resource without entries.
        Some(Ok(resource)) if resource.entries.is_empty() => {
            bail!("describing the configs of {what}: no configs returned (does the {what} exist?)")
        }
        Some(Ok(resource)) => Ok(resource),
        Some(Err(code)) => bail!("describing the configs of {what}: {code}"),
        None => bail!("describing the configs of {what}: empty response"),
    }
}

/// The values set on the resource itself; `None` for a sensitive value the broker hides.
fn own_values(entity: &Entity, resource: &ConfigResource) -> BTreeMap<String, Option<String>> {
    let own = entity.own_source();
    resource
        .entries
        .iter()
        .filter(|e| e.source == own)
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect()
}

async fn alter(
    admin: &AdminClient<DefaultClientContext>,
    entity: &Entity,
    values: &BTreeMap<String, Option<String>>,
    opts: &AdminOptions,
) -> Result<()> {
    let hidden: Vec<&str> = values
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| k.as_str())
        .collect();
    if !hidden.is_empty() {
        bail!(
            "{} has sensitive configs whose values the broker does not return ({}); AlterConfigs \
             would drop them: set them again in the same command",
            entity.describe(),
            hidden.join(", ")
        );
    }
    let mut alter = AlterConfig::new(entity.specifier()?);
    for (k, v) in values {
        if let Some(v) = v {
            alter = alter.set(k, v);
        }
    }
    let what = entity.describe();
    let results = admin
        .alter_configs([&alter], opts)
        .await
        .with_context(|| format!("altering the configs of {what}"))?;
    for r in results {
        if let Err((_, code)) = r {
            bail!("altering the configs of {what}: {code}");
        }
    }
    // rdkafka 0.39 drops AlterConfigs' per-resource error codes (it reports every resource as
    // altered), so read the configs back to find out whether the broker applied the change.
    let now = own_values(entity, &describe(admin, entity, opts).await?);
    for (k, v) in values {
        let actual = now.get(k).cloned().flatten();
        if actual.as_ref() != v.as_ref() {
            bail!(
                "altering the configs of {what}: the broker rejected the change ({k} is {}, not \
                 {:?}); rdkafka does not pass on the broker's reason: check the name and the value",
                actual.map_or_else(|| "not set".to_string(), |a| format!("{a:?}")),
                v.as_deref().unwrap_or_default()
            );
        }
    }
    if let Some(k) = now.keys().find(|k| !values.contains_key(*k)) {
        bail!("altering the configs of {what}: the broker rejected the change ({k} is still set)");
    }
    Ok(())
}

fn source_name(source: &ConfigSource) -> &'static str {
    match source {
        ConfigSource::Unknown => "UNKNOWN",
        ConfigSource::DynamicTopic => "DYNAMIC_TOPIC_CONFIG",
        ConfigSource::DynamicBroker => "DYNAMIC_BROKER_CONFIG",
        ConfigSource::DynamicDefaultBroker => "DYNAMIC_DEFAULT_BROKER_CONFIG",
        ConfigSource::StaticBroker => "STATIC_BROKER_CONFIG",
        ConfigSource::Default => "DEFAULT_CONFIG",
    }
}

fn print_entries(entity: &Entity, entries: &[&ConfigEntry], all: bool, output: Output) {
    let mut entries = entries.to_vec();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    match output {
        Output::Json => {
            let value: Vec<_> = entries
                .iter()
                .map(|e| {
                    json!({
                        "name": e.name,
                        "value": e.value,
                        "source": source_name(&e.source),
                        "read_only": e.is_read_only,
                        "default": e.is_default,
                        "sensitive": e.is_sensitive,
                    })
                })
                .collect();
            println!("{}", serde_json::Value::Array(value));
        }
        Output::Table => {
            println!(
                "{} configs for {} are:",
                if all { "All" } else { "Dynamic" },
                entity.describe()
            );
            if entries.is_empty() {
                return;
            }
            let mut table = Table::new();
            table.load_preset(UTF8_FULL_CONDENSED);
            table.set_header(["Name", "Value", "Source", "Read-only", "Sensitive"]);
            for e in entries {
                let value = if e.is_sensitive {
                    "(sensitive)".to_string()
                } else {
                    e.value.clone().unwrap_or_else(|| "null".to_string())
                };
                table.add_row([
                    e.name.clone(),
                    value,
                    source_name(&e.source).to_string(),
                    e.is_read_only.to_string(),
                    e.is_sensitive.to_string(),
                ]);
            }
            println!("{table}");
        }
    }
}

fn print_done(entity: &Entity, output: Output) {
    match output {
        Output::Table => println!("Completed updating config for {}.", entity.describe()),
        Output::Json => println!(
            "{}",
            json!({ "updated": { "topic": entity.topic, "broker": entity.broker } })
        ),
    }
}
