//! Shared host services behind the capabilities: the HTTP client, the plugin state
//! store and the resource roots. Built once at start-up and shared by every call.
//!
//! Services do the work; they never decide permissions — [`crate::capability`] does,
//! before any service is reached.

use std::path::PathBuf;
use std::sync::Arc;

use std::net::SocketAddr;

use crate::capability::{Grants, Reach};
use crate::config::Budgets;

/// Largest HTTP request body a plugin may send.
pub const MAX_HTTP_REQUEST_BODY: usize = 8 * 1024 * 1024;
/// Largest HTTP response body (buffered or streamed) a plugin may receive.
pub const MAX_HTTP_RESPONSE_BODY: u64 = 16 * 1024 * 1024;
/// Redirects followed per request; each hop is re-checked against the allow-list.
pub const MAX_HTTP_REDIRECTS: usize = 5;
/// Headers one outbound request may carry: far above what any API needs, far below
/// the 32,768 entries at which the `http` crate's header map panics.
pub const MAX_HTTP_HEADERS: usize = 100;
/// Bytes of all header names and values of one outbound request (servers commonly
/// refuse more than 8-64 KiB anyway).
pub const MAX_HTTP_HEADER_BYTES: usize = 64 * 1024;
/// Longest URL a plugin may ask for (requests or resources).
pub const MAX_URL_BYTES: usize = 8 * 1024;
/// Longest HTTP method name (the standard ones are at most 7 bytes).
pub const MAX_HTTP_METHOD_BYTES: usize = 16;
/// Longest secret name a plugin may refer to.
pub const MAX_SECRET_NAME_BYTES: usize = 256;
/// Largest resource (agent file) a plugin may read.
pub const MAX_RESOURCE_BYTES: u64 = 4 * 1024 * 1024;
/// Longest log line kept; longer ones are truncated with a marker.
pub const MAX_LOG_LINE: usize = 8 * 1024;
/// Largest event payload (JSON) one `events.emit` may carry.
pub const MAX_EVENT_BYTES: usize = 64 * 1024;
/// Longest event kind.
pub const MAX_EVENT_KIND_BYTES: usize = 64;
/// Messages in one `model.complete` request: far above any real conversation window.
pub const MAX_MODEL_MESSAGES: usize = 10_000;
/// Tool specs in one `model.complete` request.
pub const MAX_MODEL_TOOLS: usize = 512;
// The MCP tools a subagent may be offered leave room for the sandbox tools, the Agent tool
// and a plugin's own tools in every model request (see `MAX_MCP_TOOLS`).
const _: () = assert!(
    crate::mcp_tools::MAX_MCP_TOOLS * 2 <= MAX_MODEL_TOOLS
        && crate::mcp_tools::MAX_MCP_TOOLS + warden_sandbox::TOOL_NAMES.len() + 1 < MAX_MODEL_TOOLS,
    "MCP tools, sandbox tools and the Agent tool must fit one model request"
);
/// Bytes of text (contents, arguments, schemas) in one `model.complete` request: above
/// every provider's context window, so only a flood is refused.
pub const MAX_MODEL_REQUEST_BYTES: usize = 32 * 1024 * 1024;
/// Tool calls in one `tools.call` batch (a model asks for a handful at a time).
pub const MAX_TOOL_CALLS_PER_BATCH: usize = 64;
// A task waits on one batch at a time: a whole batch of asking calls must be able to wait
// at once, within the gate's share of one task.
const _: () = assert!(MAX_TOOL_CALLS_PER_BATCH <= warden_approval::gate::MAX_PENDING_PER_TASK);
/// Bytes of one tool call's JSON arguments.
pub const MAX_TOOL_ARGUMENT_BYTES: usize = 1024 * 1024;
/// Longest identifier (tool name, call id, model name, role) a plugin may pass.
pub const MAX_NAME_BYTES: usize = 1024;

pub use crate::plugin_state::{StateBudgetExceeded, StateError, StateNamespace, StateStore};

/// The address check a [`CheckedResolver`] applies to each address a name resolves to:
/// `Ok` to connect, else the error the request fails with.
pub type AddressCheck =
    Arc<dyn Fn(&str, std::net::IpAddr) -> Result<(), Box<dyn std::error::Error + Send + Sync>> + Send + Sync>;

/// DNS for an HTTP client whose destinations are checked: resolves the name, then keeps
/// only the addresses `check` allows (for a plugin: [`Grants::check_address`], no
/// loopback, private or link-local address unless the allow-list entry allowing the URL
/// names it; for the registry client, [`Reach::allows`] of the registry's reach). The
/// client connects only to the addresses returned here, so the checked address is the
/// one connected to. (An address literal is never resolved: callers check it before
/// sending.)
pub struct CheckedResolver {
    check: AddressCheck,
}

impl CheckedResolver {
    pub fn new(check: AddressCheck) -> Arc<Self> {
        Arc::new(CheckedResolver { check })
    }
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let check = self.check.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match check(&host, a.ip()) {
                    Ok(()) => true,
                    Err(e) => {
                        refused = Some(e);
                        false
                    }
                })
                .collect();
            if allowed.is_empty() {
                return Err(refused.unwrap_or_else(|| format!("{host} has no address").into()));
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The outbound HTTP clients of one plugin, one per [`Reach`] a name can have: a request
/// goes through the client of its URL's reach ([`Grants::reach`]), whose resolver lets
/// through only the addresses that reach allows. (An address literal is never resolved;
/// the `http` capability checks it before sending.)
#[derive(Clone)]
pub struct PluginHttp {
    public: reqwest::Client,
    localhost: reqwest::Client,
}

impl PluginHttp {
    pub fn new(grants: Arc<Grants>) -> Self {
        let client = |reach| {
            let grants = grants.clone();
            let check: AddressCheck = Arc::new(move |host: &str, ip| {
                grants.check_address(reach, host, ip).map_err(|denied| Box::new(denied) as Box<_>)
            });
            crate::http_client::builder()
                .dns_resolver(CheckedResolver::new(check))
                .build()
                .expect("a reqwest client with a resolver always builds")
        };
        PluginHttp { public: client(Reach::PublicOnly), localhost: client(Reach::Loopback) }
    }

    /// The client for a request whose URL has reach `reach`.
    pub fn client(&self, reach: Reach) -> &reqwest::Client {
        match reach {
            Reach::Loopback => &self.localhost,
            Reach::PublicOnly | Reach::Address(_) => &self.public,
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
    pub http: PluginHttp,
    pub state: StateStore,
    /// Directories whose files `resources.read` may return (canonical paths).
    pub resource_roots: Vec<PathBuf>,
    /// What one call (or plugin) may consume through the imports (`plugins.budgets`).
    pub budgets: Budgets,
}

impl HostServices {
    pub fn new(resource_roots: Vec<PathBuf>) -> Self {
        // Used by calls of no particular plugin (loading); grants none, so every
        // name is checked against an empty allow-list.
        let http = PluginHttp::new(Arc::new(Grants::default()));
        let resource_roots = resource_roots.into_iter().filter_map(|p| p.canonicalize().ok()).collect();
        HostServices {
            http,
            state: StateStore::default(),
            resource_roots,
            budgets: Budgets::default(),
            tools: None,
            models: Err("no model providers are configured in this host".into()),
        }
    }

    pub fn with_tools(mut self, tools: Arc<crate::tools::ToolHost>) -> Self {
        self.tools = Some(tools);
        self
    }

    pub fn with_budgets(mut self, budgets: Budgets) -> Self {
        self.budgets = budgets;
        self
    }

    pub fn with_models(mut self, models: Result<Arc<warden_models::ModelRouter>, String>) -> Self {
        self.models = models;
        self
    }
}
