//! Generated bindings for the `warden:plugin` world. Private to the runtime: callers
//! see [`crate::plugin`] types, never bindgen output.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
    imports: { default: async },
    exports: { default: async },
    with: {
        "warden:plugin/http.body-stream": crate::runtime::host_state::BodyStream,
    },
});

pub(crate) use warden::plugin::types;
