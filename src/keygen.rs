//! `dpserve keygen STEM`: a CURVE keypair for the ZeroMQ traffic between hosts, as
//! `STEM.key` (both keys, mode 0600: the process's `--curve-secret-key`) and `STEM.pub` (the
//! public key: a peer's `--curve-server-key`, or a file in a peer's `--curve-allow-dir`).

use std::path::PathBuf;

use anyhow::Context;

#[derive(clap::Args, Debug)]
pub struct KeygenArgs {
    /// Path and name of the keypair without extension: writes `<STEM>.key` and `<STEM>.pub`
    /// (refusing to overwrite either).
    pub stem: PathBuf,
}

pub fn run(args: KeygenArgs) -> anyhow::Result<()> {
    let pair = protocol::curve::Keypair::generate()?;
    let (secret, public) = pair.write(&args.stem).context("writing the keypair")?;
    println!("public key {}", pair.public());
    println!("secret key file {} (mode 0600)", secret.display());
    println!("public key file {}", public.display());
    Ok(())
}
