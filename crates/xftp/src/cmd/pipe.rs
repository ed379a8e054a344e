//! `xftp send` and `xftp recv`.
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct SendArgs {}
#[derive(clap::Args, Debug)]
pub struct RecvArgs {}

pub async fn send(_a: SendArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("send is not built yet")
}
pub async fn recv(_a: RecvArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("recv is not built yet")
}
