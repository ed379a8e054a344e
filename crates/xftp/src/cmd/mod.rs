//! One module per group of subcommands.
pub mod pipe;
pub mod serve;
pub mod transfer;
