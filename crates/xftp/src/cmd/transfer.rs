//! `xftp get`, `xftp put`, `xftp ls`.
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct GetArgs {}
#[derive(clap::Args, Debug)]
pub struct PutArgs {}
#[derive(clap::Args, Debug)]
pub struct LsArgs {}

pub async fn get(_a: GetArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("get is not built yet")
}
pub async fn put(_a: PutArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("put is not built yet")
}
pub async fn ls(_a: LsArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("ls is not built yet")
}
