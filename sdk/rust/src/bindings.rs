//! The generated bindings of the `plugin` world of `warden:plugin` (from `wit/`), once
//! for every plugin. Plugins normally use the typed helpers and [`crate::Plugin`]; the raw
//! imports are here for what the helpers do not cover.
//!
//! The WIT types that have a plain Rust twin in this crate are not generated: the bindings
//! use the twin itself (`with`), so [`crate::Error`], the `http` request/response and the
//! `model` messages cross the boundary as they are, with no conversion code.

wit_bindgen::generate!({
    path: "wit",
    world: "plugin",
    // The export macro is called from the plugin's crate through `warden_guest::export!`.
    pub_export_macro: true,
    export_macro_name: "export_plugin_world",
    with: {
        "warden:plugin/types@0.3.0/error": crate::error::Error,
        "warden:plugin/http@0.3.0/request": crate::wire::http::Request,
        "warden:plugin/http@0.3.0/response": crate::wire::http::Response,
        "warden:plugin/http@0.3.0/stream-head": crate::wire::http::StreamHead,
        "warden:plugin/model@0.3.0/tool-spec": crate::wire::model::ToolSpec,
        "warden:plugin/model@0.3.0/tool-call": crate::wire::model::ToolCall,
        "warden:plugin/model@0.3.0/message": crate::wire::model::Message,
        "warden:plugin/model@0.3.0/completion-request": crate::wire::model::CompletionRequest,
        "warden:plugin/model@0.3.0/completion": crate::wire::model::Completion,
        "warden:plugin/tools@0.3.0/tool-result": crate::wire::model::ToolResult,
    },
});
