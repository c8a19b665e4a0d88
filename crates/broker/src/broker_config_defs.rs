//! Apache Kafka 4.4's broker and group config definitions as data (KIP-226 dynamic broker
//! configs, KIP-848 group configs): every name Kafka knows, its type, default, validator and,
//! for broker configs, whether and how AlterConfigs may change it. The table
//! ([`table`]) is generated from Kafka's jars; the rules that use it follow Kafka's
//! `DynamicBrokerConfig.validateConfigs` and `ConfigDef.parse`. gregor accepts and stores
//! every config Kafka accepts, whether or not it acts on it ([`crate::config::acted_on`]).

#[rustfmt::skip]
mod table;

pub use table::{KAFKA_BROKER_CONFIGS, KAFKA_GROUP_CONFIGS};

use crate::config::ConfigType;

/// How AlterConfigs may change a broker config (Kafka's `DynamicBrokerConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    /// Only in `server.properties` ("Cannot update these configs dynamically").
    ReadOnly,
    /// Per broker or as the cluster-wide default.
    ClusterWide,
    /// Per broker only ("Cannot update these configs at default cluster level").
    PerBroker,
    /// Only with a `listener.name.<listener>.` prefix (SSL keystores and truststores).
    ListenerOnly,
}

/// A config's value check (Kafka's `ConfigDef.Validator` kinds that broker configs use).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Validator {
    /// Any value of the type.
    None,
    /// `ConfigDef.Range`: bounds inclusive; `or_minus_one` also accepts -1.
    Range {
        /// Smallest value.
        min: Option<f64>,
        /// Largest value.
        max: Option<f64>,
        /// Whether -1 is accepted outside the range.
        or_minus_one: bool,
    },
    /// `ValidString` / `ValidList`: one of these (each element, for a list).
    OneOf(&'static [&'static str]),
    /// `CaseInsensitiveValidString`.
    OneOfIgnoreCase(&'static [&'static str]),
    /// `NonEmptyString`.
    NonEmptyString,
    /// `NonEmptyList`... as Kafka's validator of the same name.
    NonEmptyList,
}

/// One of Kafka's broker configs.
#[derive(Debug, Clone, Copy)]
pub struct KafkaBrokerConfigDef {
    /// Name, e.g. `background.threads`.
    pub name: &'static str,
    /// Type.
    pub config_type: ConfigType,
    /// Kafka's default as DescribeConfigs shows it (None: no default, or a password).
    pub default: Option<&'static str>,
    /// Value check.
    pub validator: Validator,
    /// Whether and how it may change at run time.
    pub update: Update,
}

/// One of Kafka's group configs (ConfigResource type GROUP).
#[derive(Debug, Clone, Copy)]
pub struct GroupConfigDef {
    /// Name, e.g. `consumer.session.timeout.ms`.
    pub name: &'static str,
    /// Type.
    pub config_type: ConfigType,
    /// Kafka's default.
    pub default: Option<&'static str>,
    /// Value check.
    pub validator: Validator,
    /// The broker config whose value is the default, e.g. `group.consumer.session.timeout.ms`.
    pub broker_synonym: Option<&'static str>,
}

/// Kafka's broker config `name`, if Kafka 4.4 knows it.
pub fn kafka_broker_config(name: &str) -> Option<&'static KafkaBrokerConfigDef> {
    KAFKA_BROKER_CONFIGS
        .binary_search_by(|d| d.name.cmp(name))
        .ok()
        .map(|i| &KAFKA_BROKER_CONFIGS[i])
}

/// Kafka's group config `name`, if Kafka 4.4 knows it.
pub fn group_config(name: &str) -> Option<&'static GroupConfigDef> {
    KAFKA_GROUP_CONFIGS
        .binary_search_by(|d| d.name.cmp(name))
        .ok()
        .map(|i| &KAFKA_GROUP_CONFIGS[i])
}

/// A number as Java prints the bound of a `ConfigDef.Range` (integers without a fraction).
fn bound(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        v.to_string()
    }
}

/// Kafka's `ConfigDef.parseType` and the config's validator for `value`: Ok, or the full
/// message of Kafka's `ConfigException` ("Invalid value X for configuration N: why").
///
/// # Errors
/// The message, as a string.
pub fn check_value(
    name: &str,
    config_type: ConfigType,
    validator: Validator,
    value: &str,
) -> Result<(), String> {
    let fail = |why: &str| {
        Err(format!(
            "Invalid value {value} for configuration {name}: {why}"
        ))
    };
    let v = value.trim();
    let number: Option<f64> = match config_type {
        ConfigType::Boolean => {
            if !(v.eq_ignore_ascii_case("true") || v.eq_ignore_ascii_case("false")) {
                return fail("Expected value to be either true or false");
            }
            None
        }
        ConfigType::Int => match v.parse::<i32>() {
            Ok(n) => Some(f64::from(n)),
            Err(_) => return fail("Not a number of type INT"),
        },
        ConfigType::Short => match v.parse::<i16>() {
            Ok(n) => Some(f64::from(n)),
            Err(_) => return fail("Not a number of type SHORT"),
        },
        ConfigType::Long => match v.parse::<i64>() {
            Ok(n) => Some(n as f64),
            Err(_) => return fail("Not a number of type LONG"),
        },
        ConfigType::Double => match v.parse::<f64>() {
            Ok(n) => Some(n),
            Err(_) => return fail("Not a number of type DOUBLE"),
        },
        ConfigType::String | ConfigType::List | ConfigType::Class | ConfigType::Password => None,
    };
    let items = || -> Vec<&str> {
        if config_type == ConfigType::List {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect()
        } else {
            vec![v]
        }
    };
    match validator {
        Validator::None => Ok(()),
        Validator::Range {
            min,
            max,
            or_minus_one,
        } => {
            let Some(n) = number else { return Ok(()) };
            if or_minus_one && n == -1.0 {
                return Ok(());
            }
            if let Some(m) = min.filter(|m| n < *m) {
                return fail(&format!("Value must be at least {}", bound(m)));
            }
            if let Some(m) = max.filter(|m| n > *m) {
                return fail(&format!("Value must be no more than {}", bound(m)));
            }
            Ok(())
        }
        Validator::OneOf(allowed) => {
            for item in items() {
                // `share.auto.offset.reset` also takes `by_duration:<ISO-8601 duration>`.
                let by_duration = item.starts_with("by_duration:")
                    && allowed.iter().any(|a| a.starts_with("by_duration:"));
                if !allowed.contains(&item) && !by_duration {
                    return fail(&format!("String must be one of: {}", allowed.join(", ")));
                }
            }
            Ok(())
        }
        Validator::OneOfIgnoreCase(allowed) => {
            if allowed.iter().any(|a| a.eq_ignore_ascii_case(v)) {
                Ok(())
            } else {
                fail(&format!(
                    "String must be one of (case insensitive): {}",
                    allowed.join(", ")
                ))
            }
        }
        Validator::NonEmptyString => {
            if v.is_empty() {
                fail("String may not be empty")
            } else {
                Ok(())
            }
        }
        Validator::NonEmptyList => {
            if items().is_empty() {
                fail("Empty list is not allowed")
            } else {
                Ok(())
            }
        }
    }
}

/// Kafka's `DynamicBrokerConfig.validateConfigs` for the dynamic configs a broker resource
/// would hold after a change (`props`: name -> value; `per_broker`: a broker id, not the
/// cluster default): names Kafka only reads from `server.properties`, then SSL configs
/// without a listener prefix, then each value's type and range, then (cluster default only)
/// the per-broker configs. Names Kafka does not know are accepted, as Kafka's broker accepts
/// custom configs. Each failure is Kafka's message; the handler answers INVALID_REQUEST.
///
/// # Errors
/// The first rule broken, as Kafka's message.
pub fn validate_dynamic_broker_configs<'a>(
    props: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
    per_broker: bool,
) -> Result<(), String> {
    let names_where = |update: Update| -> Vec<&'a str> {
        let mut n: Vec<&str> = props
            .clone()
            .into_iter()
            .filter(|(k, _)| kafka_broker_config(k).is_some_and(|d| d.update == update))
            .map(|(k, _)| k)
            .collect();
        n.sort_unstable();
        n
    };
    let read_only = names_where(Update::ReadOnly);
    if !read_only.is_empty() {
        return Err(format!(
            "Cannot update these configs dynamically: [{}]",
            read_only.join(", ")
        ));
    }
    let listener_only = names_where(Update::ListenerOnly);
    if !listener_only.is_empty() {
        return Err(format!(
            "These security configs can be dynamically updated only per-listener using the listener prefix: [{}]",
            listener_only.join(", ")
        ));
    }
    for (k, v) in props.clone() {
        if let Some(d) = kafka_broker_config(k) {
            check_value(k, d.config_type, d.validator, v)?;
        }
    }
    if !per_broker {
        let per_broker_only = names_where(Update::PerBroker);
        if !per_broker_only.is_empty() {
            return Err(format!(
                "Cannot update these configs at default cluster level, broker id must be specified: [{}]",
                per_broker_only.join(", ")
            ));
        }
    }
    Ok(())
}

/// Kafka's `GroupConfig.validate` for the configs a group would hold after a change
/// (`props`), with the broker's bounds from `broker_int` (the effective value of a broker
/// config such as `group.consumer.min.session.timeout.ms`): known names, types and
/// validators, the ranges the broker's `group.*` configs set, and each session timeout above
/// its heartbeat interval. Each failure is Kafka's message; the answer is INVALID_CONFIG.
///
/// # Errors
/// The first rule broken, as Kafka's message.
pub fn validate_group_configs(
    props: &std::collections::BTreeMap<String, String>,
    broker_int: impl Fn(&str) -> i64,
    broker_list: impl Fn(&str) -> Vec<String>,
) -> Result<(), String> {
    for k in props.keys() {
        if group_config(k).is_none() {
            return Err(format!("Unknown group config name: {k}"));
        }
    }
    for (k, v) in props {
        if let Some(d) = group_config(k) {
            check_value(k, d.config_type, d.validator, v)?;
        }
    }
    let int = |k: &str| props.get(k).and_then(|v| v.trim().parse::<i64>().ok());
    let range = |k: &str, min: &str, max: &str| -> Result<(), String> {
        let (lo, hi) = (broker_int(min), broker_int(max));
        match int(k) {
            Some(v) if v < lo || v > hi => {
                Err(format!("{k} must be in the range {lo} to {hi} inclusive."))
            }
            _ => Ok(()),
        }
    };
    let at_most = |k: &str, max: &str| -> Result<(), String> {
        let hi = broker_int(max);
        match int(k) {
            Some(v) if v > hi => Err(format!("{k} must be less than or equal to {hi}")),
            _ => Ok(()),
        }
    };
    let at_least = |k: &str, min: &str| -> Result<(), String> {
        let lo = broker_int(min);
        match int(k) {
            Some(v) if v < lo => Err(format!("{k} must be greater than or equal to {lo}")),
            _ => Ok(()),
        }
    };
    range(
        "consumer.heartbeat.interval.ms",
        "group.consumer.min.heartbeat.interval.ms",
        "group.consumer.max.heartbeat.interval.ms",
    )?;
    range(
        "consumer.session.timeout.ms",
        "group.consumer.min.session.timeout.ms",
        "group.consumer.max.session.timeout.ms",
    )?;
    range(
        "consumer.assignment.interval.ms",
        "group.consumer.min.assignment.interval.ms",
        "group.consumer.max.assignment.interval.ms",
    )?;
    range(
        "share.heartbeat.interval.ms",
        "group.share.min.heartbeat.interval.ms",
        "group.share.max.heartbeat.interval.ms",
    )?;
    range(
        "share.session.timeout.ms",
        "group.share.min.session.timeout.ms",
        "group.share.max.session.timeout.ms",
    )?;
    range(
        "share.record.lock.duration.ms",
        "group.share.min.record.lock.duration.ms",
        "group.share.max.record.lock.duration.ms",
    )?;
    range(
        "share.delivery.count.limit",
        "group.share.min.delivery.count.limit",
        "group.share.max.delivery.count.limit",
    )?;
    range(
        "share.partition.max.record.locks",
        "group.share.min.partition.max.record.locks",
        "group.share.max.partition.max.record.locks",
    )?;
    range(
        "share.assignment.interval.ms",
        "group.share.min.assignment.interval.ms",
        "group.share.max.assignment.interval.ms",
    )?;
    range(
        "streams.heartbeat.interval.ms",
        "group.streams.min.heartbeat.interval.ms",
        "group.streams.max.heartbeat.interval.ms",
    )?;
    range(
        "streams.session.timeout.ms",
        "group.streams.min.session.timeout.ms",
        "group.streams.max.session.timeout.ms",
    )?;
    at_most(
        "streams.num.standby.replicas",
        "group.streams.max.standby.replicas",
    )?;
    range(
        "streams.assignment.interval.ms",
        "group.streams.min.assignment.interval.ms",
        "group.streams.max.assignment.interval.ms",
    )?;
    at_least(
        "streams.task.offset.interval.ms",
        "group.streams.min.task.offset.interval.ms",
    )?;
    at_most(
        "streams.num.warmup.replicas",
        "group.streams.max.warmup.replicas",
    )?;
    if let Some(name) = props.get("streams.assignor.name") {
        let registered = broker_list("group.streams.assignors");
        if !registered.contains(name) {
            return Err(format!(
                "streams.assignor.name '{name}' is not a registered task assignor. Registered assignors are: [{}].",
                registered.join(", ")
            ));
        }
    }
    for (session, session_default, heartbeat, heartbeat_default) in [
        (
            "consumer.session.timeout.ms",
            "group.consumer.session.timeout.ms",
            "consumer.heartbeat.interval.ms",
            "group.consumer.heartbeat.interval.ms",
        ),
        (
            "share.session.timeout.ms",
            "group.share.session.timeout.ms",
            "share.heartbeat.interval.ms",
            "group.share.heartbeat.interval.ms",
        ),
        (
            "streams.session.timeout.ms",
            "group.streams.session.timeout.ms",
            "streams.heartbeat.interval.ms",
            "group.streams.heartbeat.interval.ms",
        ),
    ] {
        if !props.contains_key(session) && !props.contains_key(heartbeat) {
            continue;
        }
        let s = int(session).unwrap_or_else(|| broker_int(session_default));
        let h = int(heartbeat).unwrap_or_else(|| broker_int(heartbeat_default));
        if s <= h {
            return Err(format!("{session} must be greater than {heartbeat}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_sorted_for_binary_search() {
        assert!(KAFKA_BROKER_CONFIGS
            .windows(2)
            .all(|w| w[0].name < w[1].name));
        assert!(KAFKA_GROUP_CONFIGS
            .windows(2)
            .all(|w| w[0].name < w[1].name));
        assert!(KAFKA_BROKER_CONFIGS.len() > 350);
    }

    #[test]
    fn kafka_rules_for_dynamic_broker_configs() {
        // librdkafka's 0081_admin: configs gregor does not act on are accepted.
        assert_eq!(
            validate_dynamic_broker_configs([("background.threads", "9")], true),
            Ok(())
        );
        assert_eq!(
            validate_dynamic_broker_configs(
                [("sasl.kerberos.min.time.before.relogin", "58000")],
                true
            ),
            Ok(())
        );
        assert_eq!(
            validate_dynamic_broker_configs([("custom.config.of.a.plugin", "x")], false),
            Ok(())
        );
        assert_eq!(
            validate_dynamic_broker_configs([("num.partitions", "3")], true),
            Err("Cannot update these configs dynamically: [num.partitions]".into())
        );
        assert_eq!(
            validate_dynamic_broker_configs(
                [("sasl.kerberos.min.time.before.relogin", "58000")],
                false
            ),
            Err("Cannot update these configs at default cluster level, broker id must be specified: [sasl.kerberos.min.time.before.relogin]".into())
        );
        assert_eq!(
            validate_dynamic_broker_configs([("background.threads", "0")], true),
            Err(
                "Invalid value 0 for configuration background.threads: Value must be at least 1"
                    .into()
            )
        );
        assert_eq!(
            validate_dynamic_broker_configs([("background.threads", "nine")], true),
            Err(
                "Invalid value nine for configuration background.threads: Not a number of type INT"
                    .into()
            )
        );
        assert!(
            validate_dynamic_broker_configs([("ssl.keystore.type", "PKCS12")], true)
                .is_err_and(|e| e.contains("per-listener"))
        );
        assert!(
            validate_dynamic_broker_configs([("log.cleanup.policy", "delete,compact")], true)
                .is_ok()
        );
        assert!(
            validate_dynamic_broker_configs([("log.cleanup.policy", "delete,shred")], true)
                .is_err()
        );
    }
}
