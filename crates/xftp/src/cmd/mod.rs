//! One module per group of subcommands.
pub mod cache;
pub mod pipe;
pub mod probe;
pub mod progress;
pub mod serve;
pub mod shell;
pub mod transfer;
