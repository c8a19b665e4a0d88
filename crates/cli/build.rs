//! Embeds the git revision the binary was built from in `GREGOR_GIT_REVISION`, for
//! `gregor --version` and the start-up log line. Outside a git checkout (a source tarball) the
//! revision is `unknown`; the build never fails for want of git.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

fn main() {
    let revision = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=GREGOR_GIT_REVISION={revision}");
    // Rebuild when HEAD moves: HEAD itself (a checkout), the branch it names (a commit) and
    // packed-refs (a gc). Paths come from git, so worktrees work too.
    let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(&["rev-parse", "--git-path", &branch]));
    }
    watched.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    for path in watched.into_iter().flatten() {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
