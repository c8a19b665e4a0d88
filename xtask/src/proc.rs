//! Processes, ports and paths: `gregor_tests::process`, shared with the integration tests.

pub use gregor_tests::process::*;
