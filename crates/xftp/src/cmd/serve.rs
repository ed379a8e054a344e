//! `xftp serve` and `xftp useradd`.
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {}
#[derive(clap::Args, Debug)]
pub struct UseraddArgs {}

pub async fn run(_a: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("serve is not built yet")
}
pub fn useradd(_a: UseraddArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("useradd is not built yet")
}
