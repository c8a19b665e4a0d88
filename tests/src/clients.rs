//! rdkafka helpers that integration tests share: an admin client, topic creation, producers and
//! consumers pointed at a bootstrap address.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::BaseProducer;

/// How long a helper waits for the broker.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// A current-thread tokio runtime for rdkafka's async admin calls.
///
/// # Errors
/// When the runtime cannot be built.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building a tokio runtime")
}

/// An admin client for `bootstrap`.
///
/// # Errors
/// When the client cannot be created.
pub fn admin(bootstrap: &str) -> Result<AdminClient<DefaultClientContext>> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?)
}

/// Creates `name` with `partitions` partitions and replication factor 1.
///
/// # Errors
/// The admin client's error, or the broker's error for the topic.
pub fn create_topic(bootstrap: &str, name: &str, partitions: i32) -> Result<()> {
    create_topic_with(bootstrap, name, partitions, &[])
}

/// Creates `name` with `partitions` partitions, replication factor 1 and topic `configs`.
///
/// # Errors
/// The admin client's error, or the broker's error for the topic.
pub fn create_topic_with(
    bootstrap: &str,
    name: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) -> Result<()> {
    let mut t = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        t = t.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    for r in runtime()?.block_on(admin(bootstrap)?.create_topics(&[t], &opts))? {
        if let Err((t, e)) = r {
            bail!("creating {t}: {e}");
        }
    }
    Ok(())
}

/// A producer for `bootstrap` with `extra` settings.
///
/// # Errors
/// When the client cannot be created.
pub fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> Result<BaseProducer> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap);
    for (k, v) in extra {
        c.set(*k, *v);
    }
    Ok(c.create()?)
}

/// A consumer for `bootstrap` with `extra` settings (no group unless given).
///
/// # Errors
/// When the client cannot be created.
pub fn consumer(bootstrap: &str, extra: &[(&str, &str)]) -> Result<BaseConsumer> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap);
    for (k, v) in extra {
        c.set(*k, *v);
    }
    Ok(c.create()?)
}
