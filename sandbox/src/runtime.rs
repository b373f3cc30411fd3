//! Which OCI runtimes an engine has, and whether the sandbox's settings can work under them.
//!
//! A session container runs under `sandbox.runtime` (Docker's default, runc, when unset) or a
//! runtime of `sandbox.runtime_overrides`. Each must be registered with every Docker host, and
//! gVisor (`runsc`) must be registered with arguments that leave the sandbox's settings
//! working (the egress proxy needs none: it is reached over a Docker exec, not a host socket):
//! - `--network=none` (what `cargo xtask runsc` registers, needed on engines whose containers
//!   with `--network none` fail under gVisor's own network stack) takes every network away,
//!   so a `sandbox.network` other than `none` would silently not be there.
//!
//! [`check`] says what is wrong in words naming both settings; the sandbox calls it when it
//! connects to a host (a session is never made under a runtime that cannot serve it) and for
//! readiness. This module only reads the engine's information; it never changes anything.

use std::collections::BTreeMap;

use bollard::Docker;

use crate::config::SandboxConfig;
use crate::error::SandboxError;

/// What one engine says about its runtimes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineRuntimes {
    /// The runtime a container gets when none is named (`DefaultRuntime`, normally `runc`).
    pub default: String,
    /// Registered runtimes by name: their binary and the arguments the engine passes.
    pub registered: BTreeMap<String, RegisteredRuntime>,
}

/// One runtime the engine lists.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RegisteredRuntime {
    /// The binary (name or path) the engine runs.
    pub path: String,
    /// The arguments it passes to every invocation.
    pub args: Vec<String>,
}

/// Name of the engine's default runtime when it does not say (Docker's own default).
pub const ENGINE_DEFAULT_RUNTIME: &str = "runc";

impl RegisteredRuntime {
    /// Whether the binary is gVisor's `runsc`.
    pub fn is_gvisor(&self) -> bool {
        std::path::Path::new(&self.path).file_name().is_some_and(|f| f == "runsc")
    }

    /// The value of `--flag=value` / `-flag=value` among the arguments (the last one wins, as
    /// in runsc's flag parsing).
    fn flag(&self, flag: &str) -> Option<&str> {
        self.args.iter().filter_map(|a| a.trim_start_matches('-').strip_prefix(flag)?.strip_prefix('=')).next_back()
    }
}

impl EngineRuntimes {
    /// Reads the engine's runtimes (`GET /info`).
    pub async fn read(docker: &Docker) -> Result<Self, SandboxError> {
        let info = docker.info().await.map_err(|e| SandboxError::from_docker("read the engine's runtimes", e))?;
        let registered = info
            .runtimes
            .unwrap_or_default()
            .into_iter()
            .map(|(name, r)| {
                let path = r.path.unwrap_or_else(|| name.clone());
                (name, RegisteredRuntime { path, args: r.runtime_args.unwrap_or_default() })
            })
            .collect();
        let default =
            info.default_runtime.filter(|d| !d.is_empty()).unwrap_or_else(|| ENGINE_DEFAULT_RUNTIME.to_string());
        Ok(Self { default, registered })
    }

    /// The name a container made with `runtime` (`None`: the default) runs under.
    pub fn effective<'a>(&'a self, runtime: Option<&'a str>) -> &'a str {
        runtime.unwrap_or(&self.default)
    }
}

/// Whether every runtime `cfg` may put a session under is registered with the engine at
/// `endpoint` and can serve the sandbox's settings there. The error names the runtime's
/// setting, the conflicting setting and the engine.
pub fn check(cfg: &SandboxConfig, engine: &EngineRuntimes, endpoint: &str) -> Result<(), SandboxError> {
    for runtime in cfg.runtimes() {
        let setting = match &runtime {
            None => "sandbox.runtime (unset: the engine's default)".to_string(),
            Some(r) if cfg.runtime.as_deref() == Some(r) => format!("sandbox.runtime `{r}`"),
            Some(r) => format!("sandbox.runtime_overrides runtime `{r}`"),
        };
        let name = engine.effective(runtime.as_deref());
        let Some(registered) = engine.registered.get(name) else {
            let known: Vec<&str> = engine.registered.keys().map(String::as_str).collect();
            return Err(SandboxError::Config(format!(
                "{setting}: the Docker Engine at {endpoint} has no runtime `{name}` registered (it has: {}); register \
                 it there (gVisor: `cargo xtask runsc`, or the runtimes key of the engine's daemon.json)",
                known.join(", ")
            )));
        };
        if !registered.is_gvisor() {
            continue;
        }
        if cfg.network != "none" && registered.flag("network") == Some("none") {
            return Err(SandboxError::Config(format!(
                "sandbox.network `{}` cannot work under {setting} on the Docker Engine at {endpoint}: gVisor there \
                 is registered with `--network=none`, which gives every container no network; use `sandbox.network: \
                 none` with sandbox.egress, or register another runtime without it",
                cfg.network
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(args: &[&str]) -> EngineRuntimes {
        EngineRuntimes {
            default: "runc".into(),
            registered: BTreeMap::from([
                ("runc".into(), RegisteredRuntime { path: "runc".into(), args: vec![] }),
                (
                    "runsc".into(),
                    RegisteredRuntime {
                        path: "/usr/bin/runsc".into(),
                        args: args.iter().map(|a| a.to_string()).collect(),
                    },
                ),
            ]),
        }
    }

    fn cfg(runtime: Option<&str>) -> SandboxConfig {
        SandboxConfig { runtime: runtime.map(String::from), ..SandboxConfig::default() }
    }

    #[test]
    fn the_default_and_a_registered_runtime_pass() {
        let e = engine(&["--network=none", "--host-uds=open"]);
        check(&cfg(None), &e, "unix:///x").unwrap();
        check(&cfg(Some("runsc")), &e, "unix:///x").unwrap();
        assert_eq!(e.effective(None), "runc");
    }

    #[test]
    fn an_unregistered_runtime_names_the_setting_and_the_engine() {
        let err = check(&cfg(Some("kata")), &engine(&[]), "unix:///x").unwrap_err().to_string();
        assert!(
            err.contains("sandbox.runtime `kata`") && err.contains("unix:///x") && err.contains("runc, runsc"),
            "{err}"
        );
        let mut c = cfg(None);
        c.runtime_overrides.push(crate::config::RuntimeOverride {
            plugin: Some("p".into()),
            agent_dir: None,
            runtime: "kata".into(),
        });
        let err = check(&c, &engine(&[]), "unix:///x").unwrap_err().to_string();
        assert!(err.contains("sandbox.runtime_overrides runtime `kata`"), "{err}");
    }

    #[test]
    fn gvisor_serves_egress_without_host_sockets_and_with_no_network_refuses_a_network() {
        // Regression (issue 49): egress needed `--host-uds=open` while it was a host socket.
        let mut c = cfg(Some("runsc"));
        c.egress = Some(Default::default());
        check(&c, &engine(&["--network=none"]), "unix:///x").unwrap();

        let mut c = cfg(Some("runsc"));
        c.network = "bridge".into();
        let err = check(&c, &engine(&["--network=none"]), "unix:///x").unwrap_err().to_string();
        assert!(err.contains("sandbox.network `bridge`") && err.contains("--network=none"), "{err}");
        check(&c, &engine(&["--host-uds=open"]), "unix:///x").unwrap();
    }
}
