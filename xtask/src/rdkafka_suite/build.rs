//! Building librdkafka's `test-runner` from the librdkafka source that ships inside the
//! `rdkafka-sys` crate (its `librdkafka/tests/` directory), once per source version.
//!
//! The registry copy is never touched: the tree is copied to
//! `target/librdkafka-suite/librdkafka-<version>/` and built there. Two routes:
//!
//! - **reuse**: when a debug build of the workspace has already built librdkafka
//!   (`target/debug/build/rdkafka-sys-*/out`, which is a configured and built copy of the
//!   same tree: `librdkafka.a` and `librdkafka++.a`), that tree is copied and only the test
//!   programs are compiled. This is what CI does after its `test` suite.
//! - **from source**: `./configure` (mklove) with SSL, GSSAPI and curl off (the suite's
//!   SSL/SASL tests wait for gregor's security work anyway; the rest does not use them) and
//!   zlib and zstd on, then `make libs` and the tests.
//!
//! Either way the tests are built with RapidJSON (`rapidjson-dev`, installed when missing),
//! without which the statistics tests skip.
//!
//! A stamp file (`.xtask-built`) records the crate version and route; a later run with the
//! same source finds `tests/test-runner` and does nothing.

use crate::proc;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Flags for `./configure` on the from-source route: what rdkafka-sys configures for this
/// workspace (its default features plus `zstd`).
const CONFIGURE_FLAGS: &[&str] = &[
    "--disable-ssl",
    "--disable-gssapi",
    "--disable-curl",
    "--enable-zstd",
    "--disable-lz4-ext",
];

/// A built suite.
pub struct Suite {
    /// `librdkafka/tests/` of the build tree: `test-runner`, `test.c`, `java/`.
    pub tests_dir: PathBuf,
    /// librdkafka's version, e.g. `2.12.1`.
    pub version: String,
}

impl Suite {
    pub fn runner(&self) -> PathBuf {
        self.tests_dir.join("test-runner")
    }
}

/// The librdkafka source inside the rdkafka-sys crate the workspace locks, and the crate's
/// version (`4.10.0+2.12.1`).
///
/// # Errors
/// When `cargo metadata` fails or the crate or its `librdkafka/tests` is missing.
pub fn locate_source(root: &Path, cargo: &str) -> Result<(PathBuf, String)> {
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parsing cargo metadata's output")?;
    let package = meta["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "rdkafka-sys"))
        .context("rdkafka-sys is not among the workspace's packages")?;
    let manifest = package["manifest_path"]
        .as_str()
        .context("rdkafka-sys has no manifest_path")?;
    let version = package["version"]
        .as_str()
        .context("rdkafka-sys has no version")?
        .to_string();
    let source = Path::new(manifest)
        .parent()
        .context("rdkafka-sys's manifest has no directory")?
        .join("librdkafka");
    if !source.join("tests").join("test.c").exists() {
        bail!(
            "{} has no tests/test.c (the crate ships librdkafka's source with its tests)",
            source.display()
        );
    }
    Ok((source, version))
}

/// librdkafka's version from rdkafka-sys's (`4.10.0+2.12.1` -> `2.12.1`).
pub fn librdkafka_version(crate_version: &str) -> Result<String> {
    crate_version
        .split_once('+')
        .map(|(_, v)| v.to_string())
        .filter(|v| !v.is_empty())
        .with_context(|| {
            format!("rdkafka-sys version {crate_version} carries no +<librdkafka version>")
        })
}

/// Builds `test-runner` unless the stamp says it is built from this source (and, with
/// `from_source`, by the from-source route, which it then takes).
///
/// # Errors
/// When a build dependency cannot be installed or a build step fails (its output is on
/// the terminal).
pub fn ensure(root: &Path, cargo: &str, from_source: bool) -> Result<Suite> {
    let (source, crate_version) = locate_source(root, cargo)?;
    let version = librdkafka_version(&crate_version)?;
    let build = root
        .join("target")
        .join("librdkafka-suite")
        .join(format!("librdkafka-{version}"));
    let tests_dir = build.join("tests");
    let suite = Suite {
        tests_dir: tests_dir.clone(),
        version: version.clone(),
    };
    let stamp = build.join(".xtask-built");
    // "rapidjson": built with it (the stats tests 0053, 0098, 0101 and 0110 skip without).
    let key_prefix = format!("rdkafka-sys {crate_version}\nrapidjson\n");
    let built = std::fs::read_to_string(&stamp).unwrap_or_default();
    if suite.runner().exists()
        && built.starts_with(&key_prefix)
        && (!from_source || built.contains("\nconfigure "))
    {
        eprintln!(
            "librdkafka {version} test-runner: {} (built before)",
            suite.runner().display()
        );
        return Ok(suite);
    }
    ensure_build_tools()?;
    ensure_rapidjson()?;
    if build.exists() {
        std::fs::remove_dir_all(&build).with_context(|| format!("removing {}", build.display()))?;
    }
    std::fs::create_dir_all(&build).with_context(|| format!("creating {}", build.display()))?;
    let started = std::time::Instant::now();
    let jobs = format!(
        "-j{}",
        std::thread::available_parallelism().map_or(2, usize::from)
    );
    let reusable = if from_source {
        None
    } else {
        reusable_rdkafka_sys_build(root, &version)
    };
    let route = match reusable {
        Some(out) => {
            eprintln!(
                "Building librdkafka {version}'s test-runner on the library rdkafka-sys built in {}",
                out.display()
            );
            copy_tree(&out, &build)?;
            format!("reuse {}", out.display())
        }
        None => {
            ensure_build_headers()?;
            eprintln!(
                "Building librdkafka {version} and its test-runner from {} (a few minutes)",
                source.display()
            );
            copy_tree(&source, &build)?;
            proc::run_checked(
                Command::new("./configure")
                    .args(CONFIGURE_FLAGS)
                    .current_dir(&build),
            )
            .context("configuring librdkafka")?;
            proc::run_checked(
                Command::new("make")
                    .args([jobs.as_str(), "libs"])
                    .current_dir(&build),
            )
            .context("building librdkafka")?;
            format!("configure {}", CONFIGURE_FLAGS.join(" "))
        }
    };
    // On the reuse route, rdkafka-sys's configure ran without RapidJSON's headers: the
    // define it would have written to config.h comes from CPPFLAGS (the Makefile appends its
    // own to the environment's).
    proc::run_checked(
        Command::new("make")
            .args([jobs.as_str(), "test-runner"])
            .env("CPPFLAGS", "-DWITH_RAPIDJSON=1")
            .current_dir(&tests_dir),
    )
    .context("building librdkafka's test-runner")?;
    if !suite.runner().exists() {
        bail!("make finished but {} is missing", suite.runner().display());
    }
    std::fs::write(&stamp, format!("{key_prefix}{route}\n"))
        .with_context(|| format!("writing {}", stamp.display()))?;
    eprintln!(
        "Built {} in {:.0} s",
        suite.runner().display(),
        started.elapsed().as_secs_f64()
    );
    Ok(suite)
}

/// A `target/debug/build/rdkafka-sys-*/out` (or release) tree that rdkafka-sys finished
/// building for librdkafka `version`: both static libraries and the test sources present.
/// The newest when there are several.
fn reusable_rdkafka_sys_build(root: &Path, version: &str) -> Option<PathBuf> {
    let mut candidates = Vec::new();
    for profile in ["debug", "release"] {
        let Ok(dirs) = std::fs::read_dir(root.join("target").join(profile).join("build")) else {
            continue;
        };
        for dir in dirs.flatten() {
            if !dir
                .file_name()
                .to_string_lossy()
                .starts_with("rdkafka-sys-")
            {
                continue;
            }
            let out = dir.path().join("out");
            let config = std::fs::read_to_string(out.join("Makefile.config")).unwrap_or_default();
            let same_version = config.lines().any(|l| {
                l.split_whitespace().collect::<Vec<_>>() == ["RDKAFKA_VERSION_STR=", version]
            });
            let built = ["src/librdkafka.a", "src-cpp/librdkafka++.a", "tests/test.c"]
                .iter()
                .all(|f| out.join(f).exists());
            // The paths it was configured with (zstd from zstd-sys) must still exist.
            let paths_exist = config
                .split_whitespace()
                .filter_map(|w| w.strip_prefix("-I").or_else(|| w.strip_prefix("-L")))
                .all(|p| Path::new(p).exists());
            if same_version && built && paths_exist {
                let modified = std::fs::metadata(out.join("src-cpp/librdkafka++.a"))
                    .and_then(|m| m.modified())
                    .ok();
                candidates.push((modified, out));
            }
        }
    }
    candidates.sort();
    candidates.pop().map(|(_, out)| out)
}

/// `cp -a SRC/. DST` (timestamps kept, so make sees the copied objects as up to date).
fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    let mut from = src.as_os_str().to_owned();
    from.push("/.");
    proc::run_checked(Command::new("cp").arg("-a").arg(from).arg(dst))
        .with_context(|| format!("copying {} to {}", src.display(), dst.display()))
}

/// gcc, g++ and make (Debian's `build-essential`), installed with apt-get when missing.
fn ensure_build_tools() -> Result<()> {
    let missing: Vec<&str> = ["gcc", "g++", "make"]
        .into_iter()
        .filter(|p| crate::test::which(p).is_none())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!(
        "{} missing: installing Debian's build-essential to build librdkafka's test-runner",
        missing.join(", ")
    );
    crate::test::apt_get_install(&["build-essential"])
}

/// RapidJSON's headers (Debian's `rapidjson-dev`), which the suite's C++ tests use to check
/// the statistics JSON; installed when missing.
fn ensure_rapidjson() -> Result<()> {
    if Path::new("/usr/include/rapidjson/schema.h").exists() {
        return Ok(());
    }
    eprintln!("installing rapidjson-dev (headers the suite's statistics tests use) with apt-get");
    crate::test::apt_get_install(&["rapidjson-dev"])
}

/// The headers of the compression libraries librdkafka links (zlib, zstd): Debian's
/// `zlib1g-dev` and `libzstd-dev`, installed when missing.
fn ensure_build_headers() -> Result<()> {
    let missing: Vec<&str> = [("zlib.h", "zlib1g-dev"), ("zstd.h", "libzstd-dev")]
        .into_iter()
        .filter(|(h, _)| !Path::new("/usr/include").join(h).exists())
        .map(|(_, p)| p)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!(
        "installing {} (headers librdkafka's build needs) with apt-get",
        missing.join(" ")
    );
    crate::test::apt_get_install(&missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn librdkafka_version_from_the_crate_version() {
        assert_eq!(librdkafka_version("4.10.0+2.12.1").unwrap(), "2.12.1");
        assert!(librdkafka_version("4.10.0").is_err());
        assert!(librdkafka_version("4.10.0+").is_err());
    }
}
