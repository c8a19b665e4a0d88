//! PNG
