//! The `gregor` binary: `gregor serve` runs a broker; `gregor storage` formats a node's log
//! dirs as Kafka's `kafka-storage`; `gregor dev cluster` runs a local N-node cluster; the other subcommands are Kafka clients (built on
//! rdkafka) for topics, producing and consuming.

mod client;
mod dev;
mod storage;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use tracing::{info, warn};
use tracing_subscriber::EnvFilter;

/// `gregor --version`: the package version and the git revision it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("GREGOR_GIT_REVISION"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "gregor",
    version = VERSION,
    about = "A Kafka-compatible event-streaming platform"
)]
struct Cli {
    /// Log format of the server and tools.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run a broker (with no arguments: a one-node cluster on 127.0.0.1:9092, data in
    /// ./gregor-data).
    Serve(ServeArgs),
    /// Format a node's log dirs, as Kafka's `kafka-storage` (format, random-uuid).
    #[command(subcommand)]
    Storage(storage::StorageCommand),
    /// Development tools: `dev cluster` runs a local N-node KRaft cluster.
    #[command(subcommand)]
    Dev(dev::DevCommand),
    #[command(flatten)]
    Client(client::ClientCommand),
    /// Print a shell completion script, e.g. `gregor completions bash >
    /// /usr/share/bash-completion/completions/gregor`.
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), e.g. `gregor man > /usr/share/man/man1/gregor.1`; with
    /// `--dir`, write one page per subcommand there (gregor.1, gregor-serve.1, ...).
    Man {
        /// Write gregor.1 and a page for every subcommand into this directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// A Kafka `server.properties` file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override one property, e.g. `--set log.dirs=/data/gregor` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
}

fn init_logging(format: LogFormat, default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn load_properties(args: &ServeArgs) -> Result<BTreeMap<String, String>> {
    let mut props = BTreeMap::new();
    if let Some(path) = &args.config {
        let file = std::fs::File::open(path)
            .with_context(|| format!("opening config file {}", path.display()))?;
        let map = java_properties::read(std::io::BufReader::new(file))
            .with_context(|| format!("parsing config file {}", path.display()))?;
        props.extend(map);
    }
    for kv in &args.overrides {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("--set expects KEY=VALUE, got {kv:?}");
        };
        props.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(props)
}

async fn serve(args: ServeArgs) -> Result<()> {
    let props = load_properties(&args)?;
    let (config, report) = gregor_broker::BrokerConfig::from_properties(props)?;
    // Every key gregor does not act on, once, grouped by why.
    for line in report.lines() {
        warn!("{line}");
    }
    // Installed before anything starts: the client listener opens before `start` returns, and
    // a SIGTERM then (a process manager, `gregor dev cluster`) must not find the default
    // action, which ends the process without flushing or the clean shutdown marker. A signal
    // during start-up lets start-up finish for up to START_GRACE and then shuts down cleanly;
    // a start-up that cannot finish (a node waiting for a quorum whose other voters are
    // down) is abandoned then, or at a second signal, and the logs are recovered at the next
    // start, as after a crash.
    let mut signals = ShutdownSignals::install()?;
    let start = gregor_broker::start(config);
    tokio::pin!(start);
    let mut signalled = false;
    let running = tokio::select! {
        r = &mut start => r,
        () = signals.wait() => {
            signalled = true;
            info!(grace_s = START_GRACE.as_secs(), "a shutdown signal arrived during start-up; letting start-up finish first");
            tokio::select! {
                r = &mut start => r,
                () = signals.wait() => {
                    warn!("a second shutdown signal during start-up: exiting without a clean shutdown; the logs are recovered at the next start");
                    return Ok(());
                }
                () = tokio::time::sleep(START_GRACE) => {
                    warn!(grace_s = START_GRACE.as_secs(), "start-up did not finish (is a majority of the metadata quorum's voters running?): exiting without a clean shutdown; the logs are recovered at the next start");
                    return Ok(());
                }
            }
        }
    }
    .context("starting the broker")?;
    info!(
        cluster_id = %running.broker.cluster_id,
        node_id = running.broker.config.node_id,
        "gregor {VERSION} started"
    );
    tokio::select! {
        () = signals.wait(), if !signalled => {}
        () = std::future::ready(()), if signalled => {}
        reason = running.metadata_quorum_failed() => {
            // As Kafka's broker halts: no clean shutdown (it would wait on the quorum); the
            // logs recover at the next start.
            let metadata_dir = gregor_broker::server::metadata_log_dir(&running.broker.config);
            tracing::error!(%reason, metadata_log_dir = %metadata_dir.display(),
                "the metadata quorum member stopped on a storage error; exiting");
            bail!(
                "the metadata log stopped: {reason}; free space in (or repair) the metadata \
                 log dir {} (metadata.log.dir, by default the first of log.dirs) and start \
                 the broker again",
                metadata_dir.display()
            );
        }
    }
    info!("shutting down: flushing and closing logs");
    running
        .shutdown()
        .await
        .context("closing logs at shutdown")?;
    info!("shut down cleanly");
    Ok(())
}

/// How long a shutdown signal that arrives during start-up waits for start-up to finish (and
/// then shut down cleanly) before the process exits without a clean shutdown.
const START_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// SIGTERM and SIGINT, caught from the moment [`ShutdownSignals::install`] runs.
struct ShutdownSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    fn install() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
        })
    }

    /// Until SIGTERM or SIGINT, including one that came before this call (and after the
    /// previous call returned).
    async fn wait(&mut self) {
        tokio::select! {
            _ = self.term.recv() => info!("received SIGTERM"),
            _ = self.int.recv() => info!("received SIGINT"),
        }
    }
}

/// Runs the command; an error is printed as one chain of causes (`error: ...: ...`) and exits
/// with 1. `RUST_BACKTRACE` is for panics: a user's mistake (a wrong flag value, a broker that
/// is not running) is not a bug, so its message never carries a backtrace.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// `e` and its causes joined with ": ", leaving out a cause whose text the message before it
/// already ends with (many error types print their source in their own message too).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// The default action for SIGPIPE, as Unix command-line tools have: `gregor topic list | head`
/// then ends quietly when `head` exits, instead of failing (or panicking, in `println!`) on
/// EPIPE. Rust starts programs with SIGPIPE ignored; the server keeps that, since its peers'
/// sockets may close under it. librdkafka and std's sockets send with MSG_NOSIGNAL, so a broker
/// that goes away never raises SIGPIPE in the client commands.
#[allow(unsafe_code)] // one libc call; no safe interface sets a signal's disposition
fn restore_default_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL at start-up, before any thread exists,
    // installs no handler and touches no Rust state.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_) | Command::Dev(_)) {
        restore_default_sigpipe();
    }
    let command = match cli.command {
        Command::Storage(cmd) => {
            init_logging(cli.log_format, "warn");
            return storage::run(cmd);
        }
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            // Into memory first: clap_complete panics when its writer fails (`| head`).
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "gregor", &mut script);
            return write_stdout(&script);
        }
        Command::Man { dir } => return man(dir),
        other => other,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    match command {
        Command::Serve(args) => {
            init_logging(cli.log_format, "info");
            let result = rt.block_on(serve(args));
            // After a fatal error the broker's tasks are still running: do not wait for them.
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
            result
        }
        Command::Client(cmd) => {
            init_logging(cli.log_format, "warn");
            rt.block_on(client::run(cmd))
        }
        Command::Dev(cmd) => {
            init_logging(cli.log_format, "warn");
            let code = rt.block_on(dev::run(cmd))?;
            if code != 0 {
                drop(rt);
                std::process::exit(code);
            }
            Ok(())
        }
        Command::Storage(cmd) => storage::run(cmd),
        Command::Completions { .. } | Command::Man { .. } => Ok(()),
    }
}

/// Writes `bytes` to stdout; a reader that went away (`| head`) is not an error.
fn write_stdout(bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

/// `gregor man`: the manual page on stdout, or with `dir` one page per (sub)command there.
fn man(dir: Option<PathBuf>) -> Result<()> {
    let command = <Cli as clap::CommandFactory>::command();
    match dir {
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(command)
                .render(&mut page)
                .context("rendering the manual page")?;
            write_stdout(&page)
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(command, &dir)
                .with_context(|| format!("writing manual pages into {}", dir.display()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::error_chain;
    use anyhow::Context;

    #[test]
    fn a_cause_the_message_already_names_is_printed_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::AddrInUse, "Address already in use");
        // An error that prints its source in its own message, as `#[error("...: {source}")]`.
        #[derive(Debug)]
        struct Listen(std::io::Error);
        impl std::fmt::Display for Listen {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "cannot listen on 127.0.0.1:9092: {}", self.0)
            }
        }
        impl std::error::Error for Listen {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Err::<(), _>(Listen(io()))
            .context("starting the broker")
            .unwrap_err();
        assert_eq!(
            error_chain(&e),
            "starting the broker: cannot listen on 127.0.0.1:9092: Address already in use"
        );
        let e = Err::<(), _>(io()).context("reading x").unwrap_err();
        assert_eq!(error_chain(&e), "reading x: Address already in use");
    }
}
