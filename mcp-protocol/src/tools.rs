//! Tools: listing, picking the agent tool, calling, results, Claude Code names.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::McpError;

/// A tool as `tools/list` describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of the arguments (`{"type": "object"}` when the server sent none).
    #[serde(default = "empty_schema")]
    pub input_schema: Value,
    /// `readOnlyHint`, `destructiveHint`, ... — hints from the server, never policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Value>,
}

fn empty_schema() -> Value {
    json!({"type": "object"})
}

impl Tool {
    /// Names of the top-level properties whose schema says `type: string`.
    pub fn string_arguments(&self) -> Vec<&str> {
        self.properties()
            .map(|props| {
                props
                    .iter()
                    .filter(|(_, s)| s.get("type").and_then(Value::as_str) == Some("string"))
                    .map(|(k, _)| k.as_str())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn properties(&self) -> Option<&serde_json::Map<String, Value>> {
        self.input_schema.get("properties").and_then(Value::as_object)
    }

    /// True for a tool with exactly one argument, a string.
    pub fn takes_one_string(&self) -> bool {
        self.properties().is_some_and(|p| p.len() == 1) && self.string_arguments().len() == 1
    }

    /// `annotations.<hint>` as a bool, if the server gave it.
    pub fn hint(&self, hint: &str) -> Option<bool> {
        self.annotations.as_ref()?.get(hint)?.as_bool()
    }
}

/// One page of `tools/list`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolsPage {
    pub tools: Vec<Tool>,
    pub next_cursor: Option<String>,
}

impl ToolsPage {
    /// Reads a `tools/list` result, taking it apart by value (nothing is copied). Tools
    /// that do not parse are skipped (named in `skipped`). The listing's bounds are
    /// [`crate::Listing`]'s.
    pub fn from_result(mut result: Value) -> Result<(ToolsPage, Vec<String>), McpError> {
        let Some(Value::Array(list)) = result.get_mut("tools").map(Value::take) else {
            return Err(McpError::Protocol("tools/list result without a `tools` array".into()));
        };
        let mut tools = Vec::new();
        let mut skipped = Vec::new();
        for t in list {
            let name = t.get("name").and_then(Value::as_str).unwrap_or("?").chars().take(100).collect::<String>();
            match serde_json::from_value::<Tool>(t) {
                Ok(tool) => tools.push(tool),
                Err(e) => skipped.push(format!("{name:?}: {e}")),
            }
        }
        let next_cursor = result.get("nextCursor").and_then(Value::as_str).filter(|c| !c.is_empty()).map(str::to_owned);
        Ok((ToolsPage { tools, next_cursor }, skipped))
    }
}

/// Which tool acts as the agent, and which of its arguments takes the prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentTool {
    pub tool: String,
    pub argument: String,
}

/// Picks the agent tool: `tool` by name if given, else the server's only tool with one
/// string argument; the prompt argument is `argument` if given, else the tool's only
/// string argument. Errors say what to configure.
pub fn select_agent_tool(
    tools: &[Tool],
    tool: Option<&str>,
    argument: Option<&str>,
) -> Result<(Tool, AgentTool), String> {
    let names = || tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ");
    let chosen = match tool {
        Some(name) => tools
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| format!("the server has no tool {name:?} (it has: {})", names()))?,
        None => {
            let candidates: Vec<&Tool> = tools.iter().filter(|t| t.takes_one_string()).collect();
            match candidates.as_slice() {
                [one] => *one,
                [] => {
                    return Err(format!(
                        "no tool takes exactly one string argument; set metadata `tool` (tools: {})",
                        names()
                    ));
                }
                many => {
                    return Err(format!(
                        "several tools take one string argument ({}); set metadata `tool`",
                        many.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }
    };
    let argument = match argument {
        Some(a) => {
            let declared = chosen.properties().is_none_or(|p| p.is_empty() || p.contains_key(a));
            if !declared {
                return Err(format!("tool {:?} has no argument {a:?}", chosen.name));
            }
            a.to_owned()
        }
        None => match chosen.string_arguments().as_slice() {
            [one] => (*one).to_owned(),
            [] => return Err(format!("tool {:?} has no string argument; set metadata `argument`", chosen.name)),
            many => {
                let required: Vec<&str> = chosen
                    .input_schema
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).filter(|n| many.contains(n)).collect())
                    .unwrap_or_default();
                match required.as_slice() {
                    [one] => (*one).to_owned(),
                    _ => {
                        return Err(format!(
                            "tool {:?} has several string arguments ({}); set metadata `argument`",
                            chosen.name,
                            many.join(", ")
                        ));
                    }
                }
            }
        },
    };
    Ok((chosen.clone(), AgentTool { tool: chosen.name.clone(), argument }))
}

/// The outcome of `tools/call`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    /// The text blocks (and text resources) joined with `\n`; non-text blocks are
    /// named in brackets. When there is no content but `structuredContent`, its JSON.
    pub text: String,
    /// `isError`: the tool ran and failed; `text` says why.
    pub is_error: bool,
    pub structured: Option<Value>,
    pub content: Vec<Value>,
}

impl ToolResult {
    /// Reads a `tools/call` result (either era). A 2026-07-28 `input_required`
    /// result is [`McpError::Unsupported`].
    pub fn from_result(mut result: Value) -> Result<ToolResult, McpError> {
        if let Some(kind) = result.get("resultType").and_then(Value::as_str)
            && kind != "complete"
        {
            return Err(McpError::Unsupported(format!(
                "the server answered with resultType {kind:?}, which this client does not handle"
            )));
        }
        // Taken apart by value: a large result is never copied.
        let content = match result.get_mut("content").map(Value::take) {
            Some(Value::Array(c)) => c,
            None | Some(Value::Null) => Vec::new(),
            Some(_) => return Err(McpError::Protocol("tools/call `content` is not an array".into())),
        };
        let structured = result.get_mut("structuredContent").map(Value::take).filter(|v| !v.is_null());
        let mut parts = Vec::new();
        for block in &content {
            match block.get("type").and_then(Value::as_str).unwrap_or("") {
                "text" => parts.push(block.get("text").and_then(Value::as_str).unwrap_or("").to_owned()),
                "resource" => match block.get("resource").and_then(|r| r.get("text")).and_then(Value::as_str) {
                    Some(t) => parts.push(t.to_owned()),
                    None => parts.push("[binary resource]".into()),
                },
                "resource_link" => {
                    parts.push(format!("[resource: {}]", block.get("uri").and_then(Value::as_str).unwrap_or("?")))
                }
                other => parts.push(format!(
                    "[{} content{}]",
                    if other.is_empty() { "unknown" } else { other },
                    block.get("mimeType").and_then(Value::as_str).map(|m| format!(", {m}")).unwrap_or_default()
                )),
            }
        }
        let mut text = parts.join("\n");
        if content.is_empty()
            && let Some(s) = &structured
        {
            text = s.to_string();
        }
        Ok(ToolResult {
            text,
            is_error: result.get("isError").and_then(Value::as_bool).unwrap_or(false),
            structured,
            content,
        })
    }
}

/// Claude Code's name for an MCP tool: `mcp__<server>__<tool>`, each part reduced to
/// `[A-Za-z0-9_-]` (other characters become `_`). Lossy: a host offering tools uses
/// [`checked_tool_name`], which refuses what this would have to change.
pub fn claude_tool_name(server: &str, tool: &str) -> String {
    format!("mcp__{}__{}", sanitize(server), sanitize(tool))
}

/// Longest `mcp__<server>__<tool>` name: model APIs refuse longer tool names (OpenAI's
/// and Anthropic's limit is 64 characters).
pub const MAX_TOOL_NAME: usize = 64;

/// Why a server or tool name cannot be part of an `mcp__<server>__<tool>` name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamePartError {
    Empty,
    /// A character outside `[A-Za-z0-9_-]`.
    Character(char),
    /// `__` (the separator) inside the part, or `_` at its start or end, where it would
    /// join the separator: the name would read as another server's tool.
    Separator,
    /// The whole name would exceed [`MAX_TOOL_NAME`].
    TooLong(usize),
}

impl std::fmt::Display for NamePartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NamePartError::Empty => f.write_str("the name is empty"),
            NamePartError::Character(c) => write!(f, "{c:?} is not a letter, digit, `_` or `-`"),
            NamePartError::Separator => f.write_str("`__`, or `_` at the start or end, would join the `__` separator"),
            NamePartError::TooLong(n) => {
                write!(f, "mcp__<server>__<tool> would be {n} characters, over {MAX_TOOL_NAME}")
            }
        }
    }
}

impl std::error::Error for NamePartError {}

/// Checks one part (a server's or a tool's name) of `mcp__<server>__<tool>`: letters,
/// digits, `_` and `-`, no `__`, no `_` at either end. Parts that pass make the name
/// unambiguous: [`parse_claude_tool_name`] gives them back, and no other server's name
/// is a prefix of it.
pub fn check_name_part(part: &str) -> Result<(), NamePartError> {
    if part.is_empty() {
        return Err(NamePartError::Empty);
    }
    if let Some(c) = part.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-')) {
        return Err(NamePartError::Character(c));
    }
    if part.contains("__") || part.starts_with('_') || part.ends_with('_') {
        return Err(NamePartError::Separator);
    }
    Ok(())
}

/// `mcp__<server>__<tool>` when both parts pass [`check_name_part`] and the whole fits
/// [`MAX_TOOL_NAME`]; nothing is rewritten, so the name maps back to exactly this server
/// and tool.
pub fn checked_tool_name(server: &str, tool: &str) -> Result<String, NamePartError> {
    check_name_part(server)?;
    check_name_part(tool)?;
    let name = format!("mcp__{server}__{tool}");
    if name.len() > MAX_TOOL_NAME {
        return Err(NamePartError::TooLong(name.len()));
    }
    Ok(name)
}

/// Splits `mcp__<server>__<tool>` at the first `__` after the prefix (server names
/// must not contain `__`). `None` for other names.
pub fn parse_claude_tool_name(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_prefix("mcp__")?;
    let (server, tool) = rest.split_once("__")?;
    (!server.is_empty() && !tool.is_empty()).then_some((server, tool))
}

fn sanitize(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect()
}
