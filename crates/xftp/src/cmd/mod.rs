//! One module per group of subcommands.
pub mod pipe;
pub mod probe;
pub mod serve;
pub mod transfer;
