//! What an MCP server's replies may cost the client. A server is a peer (a remote service,
//! or third-party code in a sandbox), so every reply is held to these bounds before it is
//! parsed or kept: bytes of one reply and of a server's whole tool listing, the memory a
//! reply takes once parsed, and what each listed tool may carry. [`crate::Pending`]
//! enforces the reply bounds; [`Listing`] the listing bounds.
//!
//! Why bytes alone are not enough: `serde_json::Value` spends 32 bytes per node and a
//! one-entry object is a B-tree leaf of about 600 bytes, so 7 bytes of text (`{"":0},`)
//! can become 700 bytes of memory. [`parsed_size`] estimates that cost from the text in
//! one pass without allocating, and a reply whose estimate exceeds [`MAX_PARSED_BYTES`]
//! is refused unparsed.

use std::collections::HashSet;

use serde_json::Value;

use crate::error::McpError;
use crate::tools::{Tool, ToolsPage};

/// Most pages of one server's `tools/list` read ([`Listing`]): a server answering
/// every page with a new cursor is not followed forever.
pub const MAX_TOOL_PAGES: usize = 50;
/// Largest reply to a request that is neither a listing nor a tool call (negotiation,
/// notifications): far above any real `initialize` or `server/discover` answer.
pub const MAX_REPLY_BYTES: usize = 16 * 1024 * 1024;
/// Largest `tools/call` reply. The text a subagent gets is cut much shorter (the host cuts
/// it to `sandbox.max_output`, like every tool's output); this bounds what is read and
/// parsed to produce it, leaving room for a result's `structuredContent` beside its text.
pub const MAX_RESULT_BYTES: usize = 8 * 1024 * 1024;
/// Largest non-2xx body kept: only its JSON-RPC error or a short excerpt is used.
pub const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;
/// Largest estimated memory ([`parsed_size`]) one reply may take once parsed: four times
/// the result bound, which ordinary JSON (text, schemas) stays well under, while a page of
/// tiny objects amplified a hundredfold does not.
pub const MAX_PARSED_BYTES: usize = 4 * MAX_RESULT_BYTES;
/// Bytes of one server's whole tool listing, all pages together. A large real server
/// (a hundred tools with detailed schemas) lists a few hundred KiB.
pub const MAX_LIST_BYTES: usize = 4 * 1024 * 1024;
/// Tools kept from one server: more than any real server offers, and well under the
/// host's bound on all MCP tools together, so one server cannot crowd out the others.
pub const MAX_LIST_TOOLS: usize = 128;
/// Longest tool description (and title) kept; a longer one is cut. Descriptions go into
/// every model request of every subagent that sees the tool.
pub const MAX_TOOL_DESCRIPTION: usize = 4 * 1024;
/// Largest input schema (as JSON text) of a tool kept; a tool with a larger one is not
/// offered (a schema cannot be cut). Real schemas are a few KiB.
pub const MAX_TOOL_SCHEMA: usize = 64 * 1024;
/// Largest annotations object (as JSON text) kept: hints such as `readOnlyHint` are a few
/// dozen bytes; larger annotations are dropped (they are shown to the model as hints).
pub const MAX_TOOL_ANNOTATIONS: usize = 512;

/// An upper estimate of the memory `serde_json::from_slice::<Value>` takes for `json`:
/// 640 bytes per object (a B-tree leaf), 64 per value (the node and a vector's spare
/// room) and the text's own bytes (strings). One pass, no allocation; the text need not
/// be valid JSON (the parse that follows says whether it is).
pub fn parsed_size(json: &[u8]) -> usize {
    const PER_OBJECT: usize = 640;
    const PER_VALUE: usize = 64;
    let (mut objects, mut values) = (0usize, 1usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in json {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' => {
                objects += 1;
                values += 1;
            }
            b'[' | b',' => values += 1,
            _ => {}
        }
    }
    objects.saturating_mul(PER_OBJECT).saturating_add(values.saturating_mul(PER_VALUE)).saturating_add(json.len())
}

/// Parses one reply after checking its [`parsed_size`] against [`MAX_PARSED_BYTES`].
pub(crate) fn parse_bounded(json: &[u8], what: &str) -> Result<Value, McpError> {
    let estimate = parsed_size(json);
    if estimate > MAX_PARSED_BYTES {
        return Err(McpError::TooLarge {
            what: format!("{what} would take about {estimate} bytes of memory parsed"),
            limit: MAX_PARSED_BYTES,
        });
    }
    serde_json::from_slice(json).map_err(|e| McpError::Protocol(format!("{what} is not JSON: {e}")))
}

/// The bounds of one server's tool listing (defaults: the constants of this module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListLimits {
    pub max_tools: usize,
    pub max_bytes: usize,
    pub max_pages: usize,
    pub max_description: usize,
    pub max_schema: usize,
    pub max_annotations: usize,
}

impl Default for ListLimits {
    fn default() -> Self {
        ListLimits {
            max_tools: MAX_LIST_TOOLS,
            max_bytes: MAX_LIST_BYTES,
            max_pages: MAX_TOOL_PAGES,
            max_description: MAX_TOOL_DESCRIPTION,
            max_schema: MAX_TOOL_SCHEMA,
            max_annotations: MAX_TOOL_ANNOTATIONS,
        }
    }
}

/// One server's tool listing, page by page, held to [`ListLimits`]: the one place a
/// listing is checked (the host's HTTP and stdio clients and [`crate::Client`] all use it).
///
/// ```text
/// let mut listing = Listing::new(ListLimits::default());
/// let mut cursor = None;
/// loop {
///     let (req, mut pending) = session.list_tools(cursor.as_deref())?;
///     pending.limit_bytes(listing.remaining_bytes());
///     /* send req, feed the reply into pending */
///     cursor = listing.add(pending.body_bytes(), pending.result()?)?;
///     if cursor.is_none() { break }
/// }
/// let (tools, warnings) = listing.finish();
/// ```
#[derive(Debug)]
pub struct Listing {
    limits: ListLimits,
    tools: Vec<Tool>,
    names: HashSet<String>,
    bytes: usize,
    pages: usize,
    cursor: Option<String>,
    warnings: Vec<String>,
}

impl Listing {
    pub fn new(limits: ListLimits) -> Self {
        Listing {
            limits,
            tools: Vec::new(),
            names: HashSet::new(),
            bytes: 0,
            pages: 0,
            cursor: None,
            warnings: Vec::new(),
        }
    }

    /// Bytes the next page's reply may take (what is left of the listing's byte bound).
    pub fn remaining_bytes(&self) -> usize {
        self.limits.max_bytes.saturating_sub(self.bytes)
    }

    /// Adds one page: `bytes` is the size of its reply ([`crate::Pending::body_bytes`]),
    /// `result` the `tools/list` result. Returns the cursor of the next page to ask for,
    /// or `None` when the listing is complete: no further page, a repeated cursor, the
    /// page bound or the tool bound reached.
    pub fn add(&mut self, bytes: usize, result: Value) -> Result<Option<String>, McpError> {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > self.limits.max_bytes {
            return Err(McpError::TooLarge { what: "tool listing".into(), limit: self.limits.max_bytes });
        }
        self.pages += 1;
        let (page, skipped) = ToolsPage::from_result(result)?;
        self.warnings.extend(skipped.into_iter().map(|s| format!("tool not offered: it does not parse ({s})")));
        for tool in page.tools {
            if self.tools.len() == self.limits.max_tools {
                self.warnings.push(format!(
                    "the server lists more than {} tools; the rest are not offered",
                    self.limits.max_tools
                ));
                return Ok(None);
            }
            if let Some(tool) = self.admit(tool) {
                self.names.insert(tool.name.clone());
                self.tools.push(tool);
            }
        }
        let next = page.next_cursor.filter(|c| self.cursor.as_ref() != Some(c));
        if next.is_some() && self.pages == self.limits.max_pages {
            self.warnings
                .push(format!("the server's listing has more than {} pages; the rest is not read", self.pages));
            return Ok(None);
        }
        self.cursor.clone_from(&next);
        Ok(next)
    }

    /// The tools kept, and why others were not (for the caller to log).
    pub fn finish(self) -> (Vec<Tool>, Vec<String>) {
        (self.tools, self.warnings)
    }

    /// One tool held to the per-tool bounds: `None` (with a warning) when it is not kept.
    fn admit(&mut self, mut tool: Tool) -> Option<Tool> {
        let shown = shown_name(&tool.name);
        if self.names.contains(&tool.name) {
            self.warnings.push(format!("tool {shown} is listed twice; only the first is offered"));
            return None;
        }
        let schema = json_len(&tool.input_schema);
        if schema > self.limits.max_schema {
            self.warnings.push(format!(
                "tool {shown} not offered: its input schema is {schema} bytes, over {}",
                self.limits.max_schema
            ));
            return None;
        }
        if let Some(a) = &tool.annotations
            && json_len(a) > self.limits.max_annotations
        {
            self.warnings.push(format!("tool {shown}: annotations over {} bytes dropped", self.limits.max_annotations));
            tool.annotations = None;
        }
        for text in [&mut tool.description, &mut tool.title].into_iter().flatten() {
            cut(text, self.limits.max_description);
        }
        Some(tool)
    }
}

/// A peer-chosen tool name as it appears in a warning: bounded and quoted (escaped).
fn shown_name(name: &str) -> String {
    format!("{:?}", name.chars().take(100).collect::<String>())
}

/// Cuts `text` to at most `max` bytes at a char boundary, marking the cut with `…`.
fn cut(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut at = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    text.truncate(at);
    text.push('…');
}

/// The length of `v` as JSON text, without building the text (also what the host's event
/// budgets count).
pub fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` to a writer that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, v);
    count.0
}
