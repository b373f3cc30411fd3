//! Generated bindings, one module per WIT version of `warden:plugin` (Zed's
//! `extension_host` layout): [`v0_1_0`] frozen, [`v0_2_0`] current ([`latest`]). Private
//! to the runtime: callers see [`crate::plugin`] types, never bindgen output.
//!
//! Every host import is implemented once, against [`latest`] (`runtime/host/*.rs`); an
//! older version's module holds thin adapters onto it and the conversions of the records
//! that changed. [`Bindings`] is one instantiated plugin of whichever version; its calls
//! take and return [`crate::plugin`] types, so the rest of the host sees one API.

pub mod v0_1_0;
pub mod v0_2_0;

pub use v0_2_0 as latest;

use wasmtime::Store;
use wasmtime::component::{Component, Instance, Linker};

use super::host_state::HostState;
use crate::plugin::{GuestError, PluginInfo, SubagentDefinition, SubagentReference, TaskCall};

/// A WIT version of `warden:plugin` this host serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum WitVersion {
    #[serde(rename = "0.1.0")]
    V0_1_0,
    #[serde(rename = "0.2.0")]
    V0_2_0,
}

/// The package every plugin world belongs to.
pub const PACKAGE: &str = "warden:plugin";

impl WitVersion {
    /// Every version this host loads, oldest first.
    pub const SUPPORTED: [WitVersion; 2] = [WitVersion::V0_1_0, WitVersion::V0_2_0];
    /// The version new plugins are built against (the SDKs, the templates).
    pub const LATEST: WitVersion = WitVersion::V0_2_0;

    pub fn as_str(self) -> &'static str {
        match self {
            WitVersion::V0_1_0 => "0.1.0",
            WitVersion::V0_2_0 => "0.2.0",
        }
    }

    pub fn parse(text: &str) -> Option<WitVersion> {
        Self::SUPPORTED.into_iter().find(|v| v.as_str() == text)
    }

    /// The supported range as text, e.g. `0.1.0–0.2.0`.
    pub fn supported_range() -> String {
        format!("{}–{}", Self::SUPPORTED[0].as_str(), Self::LATEST.as_str())
    }

    /// The versions of `warden:plugin` named by `names` (a component's import or export
    /// names, e.g. `warden:plugin/executor@0.2.0`), supported or not, sorted.
    pub fn named_in<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        let mut found: Vec<String> = names
            .into_iter()
            .filter_map(|n| n.strip_prefix(PACKAGE)?.strip_prefix('/'))
            .filter_map(|rest| rest.split_once('@').map(|(_, v)| v.to_owned()))
            .collect();
        found.sort();
        found.dedup();
        found
    }

    /// The version a component's exports are built against, or why it cannot be served:
    /// none of `warden:plugin`, several, or one outside [`Self::SUPPORTED`].
    pub fn of_exports<'a>(exports: impl IntoIterator<Item = &'a str>) -> Result<WitVersion, String> {
        let found = Self::named_in(exports);
        match found.as_slice() {
            [] => Err(format!("it exports no `{PACKAGE}` interface (meta, resolver, executor)")),
            [one] => Self::parse(one).ok_or_else(|| {
                format!(
                    "it is built against {PACKAGE}@{one}; this warden supports {PACKAGE} {} — rebuild it against a supported WIT (the SDKs and `warden plugin new` use {})",
                    Self::supported_range(),
                    Self::LATEST.as_str()
                )
            }),
            several => Err(format!("it exports several versions of {PACKAGE} ({})", several.join(", "))),
        }
    }

    /// The version of a compiled component (see [`Self::of_exports`]).
    pub fn of_component(component: &Component, engine: &wasmtime::Engine) -> Result<WitVersion, String> {
        let ty = component.component_type();
        let names: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
        Self::of_exports(names.iter().map(String::as_str))
    }
}

impl std::fmt::Display for WitVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Adds every supported version's imports (and deny-all WASI) to `linker`. The versions
/// are distinct instances (`warden:plugin/log@0.1.0`, `…@0.2.0`), so one linker serves all.
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    use wasmtime::component::HasSelf;
    v0_1_0::Plugin::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    v0_2_0::Plugin::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    Ok(())
}

/// One instantiated plugin, of the version its component was built against.
pub enum Bindings {
    V0_1_0(v0_1_0::Plugin),
    V0_2_0(v0_2_0::Plugin),
}

/// What a guest call returns: a trap (`Err`), or the plugin's own result.
type Guest<T> = wasmtime::Result<Result<T, GuestError>>;

impl Bindings {
    pub fn new(version: WitVersion, store: &mut Store<HostState>, instance: &Instance) -> wasmtime::Result<Self> {
        Ok(match version {
            WitVersion::V0_1_0 => Bindings::V0_1_0(v0_1_0::Plugin::new(store, instance)?),
            WitVersion::V0_2_0 => Bindings::V0_2_0(v0_2_0::Plugin::new(store, instance)?),
        })
    }

    pub async fn info(&self, store: &mut Store<HostState>) -> wasmtime::Result<PluginInfo> {
        let info = match self {
            Bindings::V0_1_0(b) => b.warden_plugin_meta().call_info(store).await?.into(),
            Bindings::V0_2_0(b) => b.warden_plugin_meta().call_info(store).await?,
        };
        Ok(v0_2_0::from_wit_info(info))
    }

    pub async fn can_resolve(&self, store: &mut Store<HostState>, r: &SubagentReference) -> wasmtime::Result<bool> {
        let r = v0_2_0::to_wit_reference(r);
        match self {
            Bindings::V0_1_0(b) => b.warden_plugin_resolver().call_can_resolve(store, &r.into()).await,
            Bindings::V0_2_0(b) => b.warden_plugin_resolver().call_can_resolve(store, &r).await,
        }
    }

    /// The plugin's definition of `r`, refused (`invalid-input`) when a field is over
    /// its bound ([`SubagentDefinition::check_bounds`]), whatever the WIT version.
    pub async fn resolve(&self, store: &mut Store<HostState>, r: &SubagentReference) -> Guest<SubagentDefinition> {
        let r = v0_2_0::to_wit_reference(r);
        let checked = |d: SubagentDefinition| d.check_bounds().map(|()| d).map_err(GuestError::InvalidInput);
        Ok(match self {
            Bindings::V0_1_0(b) => b
                .warden_plugin_resolver()
                .call_resolve(store, &r.into())
                .await?
                .map_err(GuestError::from)
                .and_then(v0_1_0::from_wit_definition)
                .and_then(checked),
            Bindings::V0_2_0(b) => b
                .warden_plugin_resolver()
                .call_resolve(store, &r)
                .await?
                .map(v0_2_0::from_wit_definition)
                .map_err(GuestError::from)
                .and_then(checked),
        })
    }

    pub async fn execute(
        &self,
        store: &mut Store<HostState>,
        ctx: &latest::types::TaskContext,
        call: &TaskCall,
        definition: &SubagentDefinition,
    ) -> Guest<String> {
        let call = v0_2_0::to_wit_call(call);
        Ok(match self {
            Bindings::V0_1_0(b) => {
                let def = v0_1_0::to_wit_definition(definition);
                let (ctx, call) = (ctx.clone().into(), call.into());
                b.warden_plugin_executor().call_execute(store, &ctx, &call, &def).await?.map_err(GuestError::from)
            }
            Bindings::V0_2_0(b) => {
                let def = v0_2_0::to_wit_definition(definition);
                b.warden_plugin_executor().call_execute(store, ctx, &call, &def).await?.map_err(GuestError::from)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_comes_from_the_exports() {
        let v1 = ["warden:plugin/meta@0.1.0", "warden:plugin/resolver@0.1.0", "warden:plugin/executor@0.1.0"];
        assert_eq!(WitVersion::of_exports(v1), Ok(WitVersion::V0_1_0));
        assert_eq!(WitVersion::of_exports(["warden:plugin/executor@0.2.0"]), Ok(WitVersion::V0_2_0));
        let e = WitVersion::of_exports(["warden:plugin/executor@0.3.0"]).unwrap_err();
        assert!(e.contains("warden:plugin@0.3.0") && e.contains("0.1.0–0.2.0"), "{e}");
        let e = WitVersion::of_exports(["wasi:cli/run@0.2.0"]).unwrap_err();
        assert!(e.contains("no `warden:plugin`"), "{e}");
        let e = WitVersion::of_exports(["warden:plugin/meta@0.1.0", "warden:plugin/executor@0.2.0"]).unwrap_err();
        assert!(e.contains("several"), "{e}");
    }
}
