//! The subcommands: `build`, `test`, `demo`.

use std::env;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::layout::Layout;
use crate::lint::Clippy;
use crate::python::{Python, TEST_REQUIREMENTS};
use crate::{guest, image, lint, process};

/// The cargo that runs xtask (set by `cargo run`), else `cargo` on `PATH`.
fn host_cargo() -> Command {
    Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Guests first (quick, and they fail fast on a missing toolchain), then the host binary.
pub fn build(layout: &Layout, with_host: bool) -> Result<()> {
    let outputs = guest::build_all(layout)?;
    if with_host {
        println!("xtask: building the host binary (cargo build --release -p warden)...");
        process::run(host_cargo().current_dir(&layout.root).args(["build", "--release", "-p", "warden"]))
            .context("building the host binary")?;
        outputs_line(layout, &layout.warden_bin());
    }
    for out in &outputs {
        outputs_line(layout, out);
    }
    Ok(())
}

fn outputs_line(layout: &Layout, path: &Path) {
    println!("xtask: built {} ({})", layout.rel(path).display(), guest::size_of(path));
}

/// Guests, Python peers, sandbox image, the OCI registry and the browser the tests
/// drive, then `cargo test --workspace <args>` with a private PostgreSQL running for the
/// task store's tests (`WARDEN_TEST_POSTGRES_URL`, unless it is set already).
///
/// Tests run in the dev profile (dependencies optimised, see the workspace
/// `Cargo.toml`) against the dev host binary, so a clean CI run compiles wasmtime
/// once rather than once per profile; clippy lints while that build compiles
/// ([`Clippy`]), so it is not a second compile either.
pub fn test(layout: &Layout, cargo_args: &[String]) -> Result<()> {
    lint::format(layout, false)?;
    lint::layering(layout)?;
    let fixtures = layout.fixtures();
    match &fixtures {
        Some(f) => println!("xtask: shared fixtures at {}", f.display()),
        None => println!("xtask: shared fixtures not found (tests that need them will say so); set WARDEN_FIXTURES"),
    }
    if let Some(f) = &fixtures {
        // SAFETY: set before xtask starts any thread; the test processes inherit it.
        unsafe { env::set_var("WARDEN_FIXTURES", f) };
    }
    guest::build_all(layout)?;
    let python = Python::ensure(layout)?;
    let clippy = Clippy::locate()?;

    // The machine-level setup (Python peers, sandbox image, registry, browser: downloads,
    // package installs and disk work) runs beside the host's compile, which is CPU work; a
    // clean run takes the longer of the two instead of their sum.
    let (setup, build) = std::thread::scope(|s| {
        let setup = s.spawn(|| test_machine(layout, &python));
        // One compile of everything the tests use (the host binary, every test, bench and
        // example), linted by clippy as it is compiled: the test run below rebuilds
        // nothing. (A separate `cargo build -p warden` resolved the dependencies' features
        // for that package alone, so the workspace-wide test build compiled wasmtime,
        // tokio and the rest a second time.)
        println!(
            "xtask: building the host, its tests, benches and examples, linted by clippy (warnings are errors)..."
        );
        let build = process::run(clippy.wrap(&mut host_cargo()).current_dir(&layout.root).args([
            "test",
            "--workspace",
            "--all-targets",
            "--no-run",
        ]));
        (setup.join(), build)
    });
    let machine = setup.map_err(|_| anyhow::anyhow!("the test machine's setup panicked"))??;
    build.context("building the workspace (or clippy found problems in it)")?;
    let TestMachine { registry, chromium, chromedriver } = machine;
    guest::test_native(layout, &clippy)?;
    python.test_sdk(layout)?;
    let postgres = TestPostgres::start(layout)?;
    println!("xtask: running the tests");
    process::run(
        clippy
            .wrap(&mut host_cargo())
            .current_dir(&layout.root)
            .env("WARDEN_BIN", layout.warden_dev_bin())
            .env("WARDEN_PLUGINS", layout.plugins_out())
            .env("WARDEN_TEST_PLUGINS", layout.test_plugins_out())
            .env("WARDEN_PYTHON", python.interpreter())
            .env("WARDEN_REGISTRY_BIN", &registry)
            .env("WARDEN_CHROMIUM", &chromium)
            .env("WARDEN_CHROMEDRIVER", &chromedriver)
            .env("WARDEN_UI_SCREENSHOTS", layout.target.join("ui-screenshots"))
            .env(TEST_POSTGRES_URL, postgres.url())
            .args(["test", "--workspace"])
            .args(cargo_args),
    )
    .context("tests failed")
}

/// What the tests run against besides the workspace's own builds.
struct TestMachine {
    registry: std::path::PathBuf,
    chromium: std::path::PathBuf,
    chromedriver: std::path::PathBuf,
}

/// The Python peers' packages, the sandbox image, PostgreSQL, the OCI registry and the
/// browser the tests drive: installed or built when missing (`WARDEN_REGISTRY_BIN`, `WARDEN_CHROMIUM`
/// and `WARDEN_CHROMEDRIVER` name existing ones).
fn test_machine(layout: &Layout, python: &Python) -> Result<TestMachine> {
    python.require(TEST_REQUIREMENTS)?;
    image::ensure(layout)?;
    // The sandbox tests run their boundary groups under gVisor as well as runc.
    crate::runsc::ensure()?;
    if env::var_os(TEST_POSTGRES_URL).is_none_or(|url| url.is_empty()) {
        crate::postgres::ensure_installed()?;
    }
    let registry = match env::var_os("WARDEN_REGISTRY_BIN") {
        Some(bin) => bin.into(),
        None => crate::registry::ensure()?,
    };
    let (chromium, chromedriver) = match (env::var_os("WARDEN_CHROMIUM"), env::var_os("WARDEN_CHROMEDRIVER")) {
        (Some(browser), Some(driver)) => (browser.into(), driver.into()),
        _ => crate::browser::ensure()?,
    };
    Ok(TestMachine { registry, chromium, chromedriver })
}

/// The variable naming the PostgreSQL server the task store's tests use.
const TEST_POSTGRES_URL: &str = "WARDEN_TEST_POSTGRES_URL";

/// The server named by `WARDEN_TEST_POSTGRES_URL` when it is set, else a private one
/// started for this run (and stopped when this is dropped).
enum TestPostgres {
    Given(String),
    Started(crate::postgres::Postgres),
}

impl TestPostgres {
    fn start(layout: &Layout) -> Result<Self> {
        match env::var(TEST_POSTGRES_URL) {
            Ok(url) if !url.is_empty() => {
                println!("xtask: the store tests use the PostgreSQL in {TEST_POSTGRES_URL}");
                Ok(TestPostgres::Given(url))
            }
            _ => Ok(TestPostgres::Started(crate::postgres::Postgres::start(layout)?)),
        }
    }

    fn url(&self) -> &str {
        match self {
            TestPostgres::Given(url) => url,
            TestPostgres::Started(pg) => pg.url(),
        }
    }
}

/// `cargo xtask postgres -- <command>`: `command` with a private PostgreSQL running and
/// `WARDEN_TEST_POSTGRES_URL` naming it (e.g. `cargo test -p warden --test host -- store`),
/// without the rest of `cargo xtask test`.
pub fn with_postgres(layout: &Layout, command: &[String]) -> Result<()> {
    let Some((program, args)) = command.split_first() else {
        bail!("name the command to run, e.g. cargo xtask postgres -- cargo test -p warden --test host -- store");
    };
    let postgres = TestPostgres::start(layout)?;
    process::run(Command::new(program).args(args).current_dir(&layout.root).env(TEST_POSTGRES_URL, postgres.url()))
}

/// Build, sandbox image, then the demo itself.
pub fn demo(layout: &Layout) -> Result<()> {
    build(layout, true)?;
    image::ensure(layout)?;
    run_demo(layout)
}

/// The demo run; kept thin so what "the demo" is can change in one place.
fn run_demo(layout: &Layout) -> Result<()> {
    let status = Command::new(layout.warden_bin())
        .current_dir(&layout.root)
        .arg("demo")
        .arg("--plugins")
        .arg(layout.plugins_out())
        .status()
        .with_context(|| format!("could not start {}", layout.warden_bin().display()))?;
    if !status.success() {
        bail!("the demo failed ({status})");
    }
    Ok(())
}
