//! The generated bindings of the `plugin` world of `warden:plugin` (from `wit/`), once
//! for every plugin. Plugins normally use the typed helpers and [`crate::Plugin`]; the raw
//! imports are here for what the helpers do not cover.

wit_bindgen::generate!({
    path: "wit",
    world: "plugin",
    // The export macro is called from the plugin's crate through `warden_guest::export!`.
    pub_export_macro: true,
    export_macro_name: "export_plugin_world",
});
