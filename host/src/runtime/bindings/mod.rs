//! Generated bindings, one module per WIT version of `warden:plugin` (Zed's
//! `extension_host` layout): [`v0_1_0`] and [`v0_2_0`] frozen, [`v0_3_0`] current
//! ([`latest`]). Private to the runtime: callers see [`crate::plugin`] types, never
//! bindgen output.
//!
//! Every host import is implemented once, against [`latest`] (`runtime/host/*.rs`); an
//! older version's module holds thin adapters onto it and the conversions of the records
//! that changed. [`Bindings`] is one instantiated plugin of whichever version; its calls
//! take and return [`crate::plugin`] types, so the rest of the host sees one API.

/// The bindings of the `plugin` world of a version from 0.2.0 on, in `$path` (the frozen
/// 0.2.0 and the current one share every option).
macro_rules! bindgen_plugin_world {
    ($path:literal) => {
        wasmtime::component::bindgen!({
            path: $path,
            world: "plugin",
            // Fallible imports return `Result<_, ImportError>` (`trappable_error_type`
            // below); the infallible ones (`clock` readings, `cancel`) `wasmtime::Result`,
            // so a durable task's replay can end any call that its journal does not hold.
            imports: { default: async | trappable },
            // Results are kept in a durable task's journal as JSON (`runtime/host/journal.rs`).
            additional_derives: [serde::Serialize, serde::Deserialize],
            exports: { default: async },
            with: {
                "warden:plugin/http.body-stream": crate::runtime::host_state::BodyStream,
            },
            // Every import's error reaches the plugin through `convert_error` (scrubbed).
            trappable_error_type: {
                "warden:plugin/types.error" => crate::runtime::host::ImportError,
            },
        });
    };
}

/// `From` both ways between a record of an older version and the latest's identical record: `plain`
/// fields move as they are, `into` fields convert, `vec` fields convert element-wise.
macro_rules! same_record {
    ($old:ty, $new:ty { $($f:ident),* } $(into { $($g:ident),* })? $(vec { $($h:ident),* })?) => {
        impl From<$old> for $new {
            fn from(x: $old) -> Self {
                Self {
                    $($f: x.$f,)*
                    $($($g: x.$g.into(),)*)?
                    $($($h: x.$h.into_iter().map(Into::into).collect(),)*)?
                }
            }
        }
        impl From<$new> for $old {
            fn from(x: $new) -> Self {
                Self {
                    $($f: x.$f,)*
                    $($($g: x.$g.into(),)*)?
                    $($($h: x.$h.into_iter().map(Into::into).collect(),)*)?
                }
            }
        }
    };
}

/// `From` both ways between an older version's enum and the latest's identical enum.
macro_rules! same_enum {
    ($old:ty, $new:ty { $($v:ident),* }) => {
        impl From<$old> for $new {
            fn from(x: $old) -> Self {
                match x { $(<$old>::$v => <$new>::$v,)* }
            }
        }
        impl From<$new> for $old {
            fn from(x: $new) -> Self {
                match x { $(<$new>::$v => <$old>::$v,)* }
            }
        }
    };
}

/// What every older version shares with the latest, generated inside its module (where
/// `types`, `log`, `http`, `model`, `tools`, `events`, `state`, `resources`, its `Error`
/// with `From<latest::types::Error>`, [`latest`] and the host types are in scope): the
/// conversions of the records that did not change, and its imports as thin adapters onto
/// the latest's implementations. wasmtime's `bindgen!` remaps interfaces and resources,
/// not records, and each version's interfaces have their own instance names, so this is
/// written once here instead of once per version.
macro_rules! older_version_imports {
    () => {
        same_record!(types::SubagentReference, latest::types::SubagentReference { uri, kind, metadata });
        same_record!(
            types::TaskCall,
            latest::types::TaskCall { description, prompt, subagent_type, model, resume, run_in_background }
        );
        same_record!(types::TaskContext, latest::types::TaskContext { task_id, session_id, user_id, deadline_ms });
        same_enum!(types::Capability, latest::types::Capability { Log, Http, Model, Tools, Events, State, Resources });
        same_record!(types::PluginInfo, latest::types::PluginInfo { name, version, kinds } vec { capabilities });
        same_enum!(log::Level, latest::log::Level { Trace, Debug, Info, Warn, Error });
        same_record!(http::Request, latest::http::Request { method, url, headers, body, timeout_ms, auth_secret });
        same_record!(http::Response, latest::http::Response { status, headers, body });
        same_record!(http::StreamHead, latest::http::StreamHead { status, headers });
        same_record!(model::ToolCall, latest::model::ToolCall { id, name, arguments });
        same_record!(model::ToolSpec, latest::model::ToolSpec { name, description, input_schema });
        same_record!(model::Message, latest::model::Message { role, content, tool_call_id } vec { tool_calls });
        same_record!(model::CompletionRequest, latest::model::CompletionRequest { model, max_tokens } vec { messages, tools });
        same_record!(model::Completion, latest::model::Completion { finish_reason, reasoning } into { message });
        same_record!(tools::ToolResult, latest::tools::ToolResult { id, content, is_error });

        impl types::Host for HostState {
            /// The one conversion of this version's imports' errors: the latest's (scrubbed), then mapped.
            fn convert_error(&mut self, e: ImportError) -> wasmtime::Result<Error> {
                latest::types::Host::convert_error(self, e).map(Error::from)
            }
        }

        impl log::Host for HostState {
            async fn write(&mut self, level: log::Level, message: String) -> Result<(), ImportError> {
                latest::log::Host::write(self, level.into(), message).await
            }
        }

        impl http::Host for HostState {
            async fn send(&mut self, req: http::Request) -> Result<http::Response, ImportError> {
                latest::http::Host::send(self, req.into()).await.map(Into::into)
            }

            async fn send_streaming(
                &mut self,
                req: http::Request,
            ) -> Result<(http::StreamHead, Resource<BodyStream>), ImportError> {
                let (head, body) = latest::http::Host::send_streaming(self, req.into()).await?;
                Ok((head.into(), body))
            }
        }

        impl http::HostBodyStream for HostState {
            async fn next(&mut self, stream: Resource<BodyStream>) -> Result<Option<Vec<u8>>, ImportError> {
                latest::http::HostBodyStream::next(self, stream).await
            }

            async fn drop(&mut self, stream: Resource<BodyStream>) -> wasmtime::Result<()> {
                latest::http::HostBodyStream::drop(self, stream).await
            }
        }

        impl model::Host for HostState {
            async fn complete(&mut self, req: model::CompletionRequest) -> Result<model::Completion, ImportError> {
                latest::model::Host::complete(self, req.into()).await.map(Into::into)
            }
        }

        impl tools::Host for HostState {
            async fn list(&mut self) -> Result<Vec<model::ToolSpec>, ImportError> {
                let specs = latest::tools::Host::list(self).await?;
                Ok(specs.into_iter().map(Into::into).collect())
            }

            async fn call(&mut self, calls: Vec<model::ToolCall>) -> Result<Vec<tools::ToolResult>, ImportError> {
                let calls = calls.into_iter().map(Into::into).collect();
                let results = latest::tools::Host::call(self, calls).await?;
                Ok(results.into_iter().map(Into::into).collect())
            }
        }

        impl events::Host for HostState {
            async fn emit(&mut self, kind: String, data: String) -> Result<(), ImportError> {
                latest::events::Host::emit(self, kind, data).await
            }
        }

        impl state::Host for HostState {
            async fn get(&mut self, key: String) -> Result<Option<Vec<u8>>, ImportError> {
                latest::state::Host::get(self, key).await
            }

            async fn set(&mut self, key: String, value: Vec<u8>) -> Result<(), ImportError> {
                latest::state::Host::set(self, key, value).await
            }

            async fn delete(&mut self, key: String) -> Result<(), ImportError> {
                latest::state::Host::delete(self, key).await
            }
        }

        impl resources::Host for HostState {
            async fn read(&mut self, uri: String) -> Result<Vec<u8>, ImportError> {
                latest::resources::Host::read(self, uri).await
            }
        }
    };
}

pub mod v0_1_0;
pub mod v0_2_0;
pub mod v0_3_0;

pub use v0_3_0 as latest;

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
    #[serde(rename = "0.3.0")]
    V0_3_0,
}

/// The package every plugin world belongs to.
pub const PACKAGE: &str = "warden:plugin";

impl WitVersion {
    /// Every version this host loads, oldest first.
    pub const SUPPORTED: [WitVersion; 3] = [WitVersion::V0_1_0, WitVersion::V0_2_0, WitVersion::V0_3_0];
    /// The version new plugins are built against (the SDKs, the templates).
    pub const LATEST: WitVersion = WitVersion::V0_3_0;

    pub fn as_str(self) -> &'static str {
        match self {
            WitVersion::V0_1_0 => "0.1.0",
            WitVersion::V0_2_0 => "0.2.0",
            WitVersion::V0_3_0 => "0.3.0",
        }
    }

    pub fn parse(text: &str) -> Option<WitVersion> {
        Self::SUPPORTED.into_iter().find(|v| v.as_str() == text)
    }

    /// The supported range as text, e.g. `0.1.0–0.3.0`.
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
    v0_3_0::Plugin::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    Ok(())
}

/// One instantiated plugin, of the version its component was built against.
pub enum Bindings {
    V0_1_0(v0_1_0::Plugin),
    V0_2_0(v0_2_0::Plugin),
    V0_3_0(v0_3_0::Plugin),
}

/// What a guest call returns: a trap (`Err`), or the plugin's own result.
type Guest<T> = wasmtime::Result<Result<T, GuestError>>;

impl Bindings {
    pub fn new(version: WitVersion, store: &mut Store<HostState>, instance: &Instance) -> wasmtime::Result<Self> {
        Ok(match version {
            WitVersion::V0_1_0 => Bindings::V0_1_0(v0_1_0::Plugin::new(store, instance)?),
            WitVersion::V0_2_0 => Bindings::V0_2_0(v0_2_0::Plugin::new(store, instance)?),
            WitVersion::V0_3_0 => Bindings::V0_3_0(v0_3_0::Plugin::new(store, instance)?),
        })
    }

    pub async fn info(&self, store: &mut Store<HostState>) -> wasmtime::Result<PluginInfo> {
        let info = match self {
            Bindings::V0_1_0(b) => b.warden_plugin_meta().call_info(store).await?.into(),
            Bindings::V0_2_0(b) => b.warden_plugin_meta().call_info(store).await?.into(),
            Bindings::V0_3_0(b) => b.warden_plugin_meta().call_info(store).await?,
        };
        Ok(latest::from_wit_info(info))
    }

    pub async fn can_resolve(&self, store: &mut Store<HostState>, r: &SubagentReference) -> wasmtime::Result<bool> {
        let r = latest::to_wit_reference(r);
        match self {
            Bindings::V0_1_0(b) => b.warden_plugin_resolver().call_can_resolve(store, &r.into()).await,
            Bindings::V0_2_0(b) => b.warden_plugin_resolver().call_can_resolve(store, &r.into()).await,
            Bindings::V0_3_0(b) => b.warden_plugin_resolver().call_can_resolve(store, &r).await,
        }
    }

    /// The plugin's definition of `r`, refused (`invalid-input`) when a field is over
    /// its bound ([`SubagentDefinition::check_bounds`]), whatever the WIT version.
    pub async fn resolve(&self, store: &mut Store<HostState>, r: &SubagentReference) -> Guest<SubagentDefinition> {
        let r = latest::to_wit_reference(r);
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
                .call_resolve(store, &r.into())
                .await?
                .map(v0_2_0::from_wit_definition)
                .map_err(GuestError::from)
                .and_then(checked),
            Bindings::V0_3_0(b) => b
                .warden_plugin_resolver()
                .call_resolve(store, &r)
                .await?
                .map(latest::from_wit_definition)
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
        let call = latest::to_wit_call(call);
        Ok(match self {
            Bindings::V0_1_0(b) => {
                let def = v0_1_0::to_wit_definition(definition);
                let (ctx, call) = (ctx.clone().into(), call.into());
                b.warden_plugin_executor().call_execute(store, &ctx, &call, &def).await?.map_err(GuestError::from)
            }
            Bindings::V0_2_0(b) => {
                let def = v0_2_0::to_wit_definition(definition);
                let (ctx, call) = (ctx.clone().into(), call.into());
                b.warden_plugin_executor().call_execute(store, &ctx, &call, &def).await?.map_err(GuestError::from)
            }
            Bindings::V0_3_0(b) => {
                let def = latest::to_wit_definition(definition);
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
        assert_eq!(WitVersion::of_exports(["warden:plugin/executor@0.3.0"]), Ok(WitVersion::V0_3_0));
        let e = WitVersion::of_exports(["warden:plugin/executor@0.4.0"]).unwrap_err();
        assert!(e.contains("warden:plugin@0.4.0") && e.contains("0.1.0–0.3.0"), "{e}");
        let e = WitVersion::of_exports(["wasi:cli/run@0.2.0"]).unwrap_err();
        assert!(e.contains("no `warden:plugin`"), "{e}");
        let e = WitVersion::of_exports(["warden:plugin/meta@0.1.0", "warden:plugin/executor@0.2.0"]).unwrap_err();
        assert!(e.contains("several"), "{e}");
    }
}
