//! `cargo xtask bench`: the loopback limit a consume workload is measured against (issue 15).
//!
//! One TCP connection over 127.0.0.1; the sending thread `sendfile`s a file that is in the page
//! cache, the receiving thread reads it into a 1 MiB buffer and drops it. Nothing is parsed on
//! either side, so this is what the kernel's TCP path costs and allows on this machine: the
//! most a broker could serve to one consumer connection, and the least CPU per GB it could
//! spend doing so. On loopback the receiving side's TCP processing (softirq) mostly runs in the
//! sender's context, so the sender's CPU per GB is the floor under a broker's consume CPU.

use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

/// One measurement: median of the repetitions by throughput.
#[derive(Debug, Clone)]
pub struct Loopback {
    /// Bytes sent per repetition.
    pub bytes: u64,
    /// Repetitions taken.
    pub repetitions: usize,
    /// Throughput of the median repetition, 10^6 bytes per second.
    pub mb_per_sec: f64,
    /// CPU seconds of the sending thread per 10^9 bytes, in the median repetition.
    pub sender_cpu_s_per_gb: f64,
    /// CPU seconds of the receiving thread per 10^9 bytes, in the median repetition.
    pub receiver_cpu_s_per_gb: f64,
}

impl Loopback {
    /// The report.json form.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "method": "one TCP connection over 127.0.0.1: sendfile of a file in the page cache \
                       to a thread that reads into a 1 MiB buffer and discards",
            "bytes": self.bytes,
            "repetitions": self.repetitions,
            "mb_per_sec": self.mb_per_sec,
            "sender_cpu_s_per_gb": self.sender_cpu_s_per_gb,
            "receiver_cpu_s_per_gb": self.receiver_cpu_s_per_gb,
        })
    }
}

/// CPU time of the calling thread.
pub(crate) fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// Writes a file of `bytes` under `dir` (left in the page cache), sends it `repetitions`
/// times, removes it, and returns the median repetition.
pub fn measure(dir: &Path, bytes: u64, repetitions: usize) -> Result<Loopback> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("loopback.bin");
    {
        let mut f =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        // Not all zeros, in case anything on the way compresses or dedups.
        let chunk: Vec<u8> = (0..1u32 << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut left = bytes;
        while left > 0 {
            let n = usize::try_from(left.min(chunk.len() as u64)).unwrap_or(chunk.len());
            f.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        f.sync_all()?;
    }
    let result = (0..repetitions.max(1))
        .map(|_| once(&path, bytes))
        .collect::<Result<Vec<_>>>();
    let _ = std::fs::remove_file(&path);
    let mut runs = result?;
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mb_per_sec, sender, receiver) = runs[runs.len() / 2];
    let gb = bytes as f64 / 1e9;
    Ok(Loopback {
        bytes,
        repetitions: runs.len(),
        mb_per_sec,
        sender_cpu_s_per_gb: sender / gb,
        receiver_cpu_s_per_gb: receiver / gb,
    })
}

/// One transfer: (MB/s, sender CPU s, receiver CPU s).
fn once(path: &Path, bytes: u64) -> Result<(f64, f64, f64)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let receiver = std::thread::spawn(move || -> Result<(u64, Duration)> {
        let (mut s, _) = listener.accept()?;
        let start = thread_cpu();
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            got += n as u64;
        }
        Ok((got, thread_cpu().saturating_sub(start)))
    });
    let file = std::fs::File::open(path)?;
    let stream = TcpStream::connect(addr)?;
    let started = Instant::now();
    let cpu = thread_cpu();
    let mut offset = 0u64;
    while offset < bytes {
        let left = usize::try_from(bytes - offset).unwrap_or(usize::MAX);
        let n = rustix::fs::sendfile(&stream, &file, Some(&mut offset), left)
            .context("sendfile to the loopback connection")?;
        if n == 0 {
            bail!("sendfile stopped at byte {offset} of {bytes}");
        }
    }
    let sender_cpu = thread_cpu().saturating_sub(cpu);
    stream.shutdown(Shutdown::Write)?;
    let (got, receiver_cpu) = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("the loopback receiver panicked"))??;
    let secs = started.elapsed().as_secs_f64();
    if got != bytes {
        bail!("the loopback receiver got {got} of {bytes} bytes");
    }
    Ok((
        bytes as f64 / 1e6 / secs,
        sender_cpu.as_secs_f64(),
        receiver_cpu.as_secs_f64(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_transfer_is_measured_and_cleaned_up() {
        let dir = std::env::temp_dir().join(format!("gregor-loopback-{}", std::process::id()));
        let l = measure(&dir, 3 << 20, 3).unwrap();
        assert_eq!(l.bytes, 3 << 20);
        assert_eq!(l.repetitions, 3);
        assert!(l.mb_per_sec > 0.0 && l.sender_cpu_s_per_gb >= 0.0);
        assert!(!dir.join("loopback.bin").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
