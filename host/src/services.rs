//! Shared host services behind the capabilities: the HTTP client, the plugin state
//! store and the resource roots. Built once at start-up and shared by every call.
//!
//! Services do the work; they never decide permissions — [`crate::capability`] does,
//! before any service is reached.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Largest value one `state.set` may store: transcripts fit, a memory bomb does not.
pub const MAX_STATE_VALUE: usize = 4 * 1024 * 1024;
/// Keys one plugin may hold in the state store at once.
pub const MAX_STATE_KEYS_PER_PLUGIN: usize = 10_000;
/// Largest HTTP request body a plugin may send.
pub const MAX_HTTP_REQUEST_BODY: usize = 8 * 1024 * 1024;
/// Largest HTTP response body (buffered or streamed) a plugin may receive.
pub const MAX_HTTP_RESPONSE_BODY: u64 = 16 * 1024 * 1024;
/// Redirects followed per request; each hop is re-checked against the allow-list.
pub const MAX_HTTP_REDIRECTS: usize = 5;
/// Connection timeout for outbound HTTP: a peer that does not accept within this
/// is down, whatever the call's deadline.
pub const HTTP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest resource (agent file) a plugin may read.
pub const MAX_RESOURCE_BYTES: u64 = 4 * 1024 * 1024;
/// Largest log line kept; longer ones are truncated with a marker.
pub const MAX_LOG_LINE: usize = 8 * 1024;
/// Largest event payload (JSON) one `events.emit` may carry.
pub const MAX_EVENT_BYTES: usize = 64 * 1024;
/// Events one call may emit: enough for a token stream, bounded against floods.
pub const MAX_EVENTS_PER_CALL: u32 = 100_000;

/// In-memory key/value state, scoped per plugin id. (Persistence arrives with the
/// task store; the interface stays the same.)
#[derive(Default)]
pub struct StateStore {
    inner: Mutex<HashMap<String, HashMap<String, Vec<u8>>>>,
}

impl StateStore {
    pub fn get(&self, plugin: &str, key: &str) -> Option<Vec<u8>> {
        self.inner.lock().unwrap().get(plugin).and_then(|m| m.get(key).cloned())
    }

    pub fn set(&self, plugin: &str, key: &str, value: Vec<u8>) -> Result<(), String> {
        if value.len() > MAX_STATE_VALUE {
            return Err(format!("state value of {} bytes exceeds the limit of {MAX_STATE_VALUE} bytes", value.len()));
        }
        let mut all = self.inner.lock().unwrap();
        let m = all.entry(plugin.to_owned()).or_default();
        if !m.contains_key(key) && m.len() >= MAX_STATE_KEYS_PER_PLUGIN {
            return Err(format!("state holds the maximum of {MAX_STATE_KEYS_PER_PLUGIN} keys for this plugin"));
        }
        m.insert(key.to_owned(), value);
        Ok(())
    }

    pub fn delete(&self, plugin: &str, key: &str) {
        if let Some(m) = self.inner.lock().unwrap().get_mut(plugin) {
            m.remove(key);
        }
    }
}

pub struct HostServices {
    /// The `tools` capability's host side; `None` = no sandbox tools in this host.
    pub tools: Option<Arc<crate::tools::ToolHost>>,
    /// Model providers; an error text when `models:` could not be set up.
    pub models: Result<Arc<warden_models::ModelRouter>, String>,
    /// Redirects are never followed by the client itself: the `http` capability
    /// follows them by hand so each hop passes the allow-list.
    pub http: reqwest::Client,
    pub state: StateStore,
    /// Directories whose files `resources.read` may return (canonical paths).
    pub resource_roots: Vec<PathBuf>,
}

impl HostServices {
    pub fn new(resource_roots: Vec<PathBuf>) -> Self {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(HTTP_CONNECT_TIMEOUT)
            .user_agent(concat!("warden/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("a default reqwest client always builds");
        let resource_roots = resource_roots.into_iter().filter_map(|p| p.canonicalize().ok()).collect();
        HostServices {
            http,
            state: StateStore::default(),
            resource_roots,
            tools: None,
            models: Err("no model providers are configured in this host".into()),
        }
    }

    pub fn with_tools(mut self, tools: Arc<crate::tools::ToolHost>) -> Self {
        self.tools = Some(tools);
        self
    }

    pub fn with_models(mut self, models: Result<Arc<warden_models::ModelRouter>, String>) -> Self {
        self.models = models;
        self
    }
}
