//! `cargo xtask` — warden's build tool.
//!
//! - `cargo xtask build [--plugins-only]`: the host binary (`target/release/warden`), every
//!   bundled plugin (`plugins/*/` → `target/plugins/<name>.wasm`) and every test plugin
//!   (`tests/plugins/*/` → `target/test-plugins/<name>.wasm`) as WebAssembly components.
//! - `cargo xtask test [-- <cargo test args>]`: check the style (rustfmt), build, set up the
//!   Python peers and the sandbox image, clippy with warnings as errors, then
//!   `cargo test --workspace` (dev profile) with `WARDEN_*` paths in the environment.
//! - `cargo xtask fmt`: apply `rustfmt.toml` to the workspace and every guest crate.
//! - `cargo xtask postgres -- <command>`: `command` with a private PostgreSQL running (as
//!   `cargo xtask test` starts for the task store's tests) and `WARDEN_TEST_POSTGRES_URL`
//!   naming it.
//! - `cargo xtask demo`: build, set up the sandbox image, run `warden demo`.
//! - `cargo xtask image`: build the sandbox image when it is missing or its recipe
//!   (`sandbox/image/*.txt`) changed.
//! - `cargo xtask runsc`: install gVisor (Debian's `runsc`) and register it with the local
//!   Docker Engine as the runtime `runsc`, printing what it changed (`cargo xtask test` does
//!   this too: the sandbox tests run under runc and under gVisor).
//!
//! Whatever is missing (wasm toolchain, Python packages, sandbox image) is installed where
//! that can be done without guessing, or reported with the exact command to run.

mod apt;
mod browser;
mod commands;
mod guest;
mod image;
mod layering;
mod layout;
mod lint;
mod postgres;
mod process;
mod python;
mod registry;
mod runsc;
mod toolchain;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "warden's build tool")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build the host binary and every plugin as a component.
    Build(BuildArgs),
    /// Build, set up what the tests need, run every test.
    Test {
        /// Arguments passed to `cargo test` (after `--`).
        #[arg(last = true)]
        cargo_args: Vec<String>,
    },
    /// Build, set up the sandbox image, run the demo (`warden demo`).
    Demo,
    /// Build the sandbox image when it is missing or its recipe changed.
    Image,
    /// Install gVisor (`runsc`) and register it with the local Docker Engine.
    Runsc,
    /// Apply the project's Rust style (rustfmt.toml) to the workspace and every guest crate.
    Fmt,
    /// Run a command with a private PostgreSQL for the store tests (WARDEN_TEST_POSTGRES_URL).
    Postgres {
        /// The command and its arguments (after `--`).
        #[arg(last = true)]
        command: Vec<String>,
    },
}

#[derive(Args)]
struct BuildArgs {
    /// Release build (the default and only profile; accepted for familiarity).
    #[arg(long)]
    release: bool,
    /// Build only the plugins (guest components), not the host binary.
    #[arg(long)]
    plugins_only: bool,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let layout = layout::Layout::discover()?;
    match cli.command {
        Cmd::Build(args) => {
            let _release_is_default = args.release;
            commands::build(&layout, !args.plugins_only)
        }
        Cmd::Test { cargo_args } => commands::test(&layout, &cargo_args),
        Cmd::Demo => commands::demo(&layout),
        Cmd::Image => image::ensure(&layout),
        Cmd::Runsc => runsc::ensure(),
        Cmd::Fmt => lint::format(&layout, true),
        Cmd::Postgres { command } => commands::with_postgres(&layout, &command),
    }
}
