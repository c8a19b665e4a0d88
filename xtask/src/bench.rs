//! `cargo xtask bench` (placeholder while being written).
use anyhow::Result;
use clap::Args;
#[derive(Args)]
pub struct BenchArgs {}
pub fn run(_args: &BenchArgs) -> Result<i32> {
    Ok(0)
}
