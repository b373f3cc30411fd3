//! A task's `tool_context`: its secrets, and where each one is delivered.
//!
//! An entry is a value and a delivery, chosen by the caller per entry ([`Entry`]):
//! - a plain string ([`Delivery::Named`]): a secret usable only where the operator names it
//!   (`${NAME}` in an operator's MCP server `env`); it is never exported into the sandbox;
//! - `{"value": S, "env": true}` ([`Delivery::Env`]): exported into every sandboxed command
//!   of the task under the key's variable name ([`crate::redact::env_name`]) — readable by
//!   whatever the subagent runs, and so by the model and the plugin; only names the
//!   operator lists in `sandbox.task_env` and that pass
//!   [`warden_sandbox::environment::check_name`];
//! - `{"value": S, "inject": {"host", "header", "format"}}` ([`Delivery::Inject`]): the
//!   session's egress proxy adds it to the plain-HTTP requests to that host made while a
//!   call of the task runs, as it adds `sandbox.egress.credentials`; it never enters the
//!   sandbox (only with `sandbox.egress`).
//!
//! Every value, whatever its delivery, is a secret of the task's session and scrubbed as
//! one (`crate::redact`). [`TaskSecrets::of`] is the one place entries become deliveries;
//! it refuses (naming `tool_context.<key>` and why) before the task exists. This module
//! must never log, store or quote a value.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use crate::redact::env_name;

/// One `tool_context` entry: its value and where it goes.
#[derive(Clone, PartialEq, Eq)]
pub struct Entry {
    pub value: String,
    pub delivery: Delivery,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the value.
        f.debug_struct("Entry").field("delivery", &self.delivery).finish_non_exhaustive()
    }
}

impl Entry {
    /// A secret used only where the operator names it (a plain string in the API).
    pub fn named(value: impl Into<String>) -> Entry {
        Entry { value: value.into(), delivery: Delivery::Named }
    }

    /// A secret exported into the sandbox's environment (`"env": true`).
    pub fn env(value: impl Into<String>) -> Entry {
        Entry { value: value.into(), delivery: Delivery::Env }
    }
}

/// Where a `tool_context` value is delivered (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// Only where the operator names it (`${NAME}` in an MCP server's `env`).
    Named,
    /// Exported into every sandboxed command's environment.
    Env,
    /// Added by the egress proxy to requests to one host.
    Inject(Inject),
}

/// Where the egress proxy adds a task's secret: the same fields as a
/// `sandbox.egress.credentials` entry, the value coming from the entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inject {
    /// One exact host (optionally `host:port`) that `sandbox.egress` allows.
    pub host: String,
    /// The header, e.g. `Authorization`.
    pub header: String,
    /// How the value is written; `{}` is replaced by it. Default `{}`.
    #[serde(default = "default_format")]
    pub format: String,
}

fn default_format() -> String {
    "{}".into()
}

/// The object form of an entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Object {
    value: String,
    #[serde(default)]
    env: bool,
    inject: Option<Inject>,
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Entry, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entry;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "a string (a secret used only where the operator names it), or an object \
                     {\"value\": ..., \"env\": true} or {\"value\": ..., \"inject\": {\"host\", \"header\", \"format\"}}",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Entry, E> {
                Ok(Entry::named(v))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Entry, E> {
                Ok(Entry::named(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Entry, A::Error> {
                let o = Object::deserialize(de::value::MapAccessDeserializer::new(map))?;
                let delivery = match (o.env, o.inject) {
                    (true, Some(_)) => {
                        return Err(de::Error::custom(
                            "choose one delivery: `env` (exported into the sandbox) or `inject` (added by the egress proxy)",
                        ));
                    }
                    (true, None) => Delivery::Env,
                    (false, Some(i)) => Delivery::Inject(i),
                    (false, None) => Delivery::Named,
                };
                Ok(Entry { value: o.value, delivery })
            }
        }
        d.deserialize_any(V)
    }
}

/// Why a `tool_context` entry is refused: the key (as given, control characters escaped,
/// cut) and why. Never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid tool_context.{key}: {message}")]
pub struct ToolContextError {
    pub key: String,
    pub message: String,
}

impl ToolContextError {
    fn new(key: &str, message: impl Into<String>) -> ToolContextError {
        let cut = &key[..key.floor_char_boundary(warden_sandbox::environment::MAX_NAME_BYTES)];
        ToolContextError { key: crate::text::escape_control(cut).into_owned(), message: message.into() }
    }
}

/// A task's secrets by delivery.
#[derive(Clone, Default)]
pub struct TaskSecrets {
    /// Every entry by variable name: what `${NAME}` in an operator's MCP server `env` may
    /// take.
    pub named: Vec<(String, String)>,
    /// The entries exported into every sandboxed command's environment.
    pub env: Vec<(String, String)>,
    /// The entries the egress proxy adds to requests while a call of the task runs.
    pub inject: Vec<Arc<warden_sandbox::egress::Credential>>,
}

impl std::fmt::Debug for TaskSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only, never a value.
        let names = |v: &[(String, String)]| v.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        f.debug_struct("TaskSecrets")
            .field("named", &names(&self.named))
            .field("env", &names(&self.env))
            .field("inject", &self.inject)
            .finish()
    }
}

impl TaskSecrets {
    /// The deliveries of `entries`, checked: every key names a variable
    /// ([`env_name`], non-empty, at most [`warden_sandbox::environment::MAX_NAME_BYTES`],
    /// no two keys the same one); an exported one is listed in `task_env`
    /// (`sandbox.task_env`) and passes [`warden_sandbox::environment::check_name`]; an
    /// injected one needs `egress` (the operator's `sandbox.egress` policy) and passes its
    /// credential checks.
    pub fn of(
        entries: &BTreeMap<String, Entry>,
        task_env: &[String],
        egress: Option<&warden_sandbox::EgressPolicy>,
    ) -> Result<TaskSecrets, ToolContextError> {
        let mut out = TaskSecrets::default();
        for (key, entry) in entries {
            let name = env_name(key);
            if name.is_empty() {
                return Err(ToolContextError::new(key, "keys must not be empty"));
            }
            if name.len() > warden_sandbox::environment::MAX_NAME_BYTES {
                return Err(ToolContextError::new(
                    key,
                    format!("keys are at most {} bytes", warden_sandbox::environment::MAX_NAME_BYTES),
                ));
            }
            if out.named.iter().any(|(n, _)| *n == name) {
                return Err(ToolContextError::new(key, format!("another key names the variable {name} too")));
            }
            match &entry.delivery {
                Delivery::Named => {}
                Delivery::Env => {
                    warden_sandbox::environment::check_name(&name)
                        .map_err(|e| ToolContextError::new(key, format!("cannot be exported: {e}")))?;
                    if !task_env.contains(&name) {
                        return Err(ToolContextError::new(
                            key,
                            format!(
                                "cannot be exported as {name}: the operator does not list it in sandbox.task_env \
                                 (what a task exports, every command, the model and the plugin can read; \
                                 use a plain string, or `inject`, to keep it out of the sandbox)"
                            ),
                        ));
                    }
                    out.env.push((name.clone(), entry.value.clone()));
                }
                Delivery::Inject(i) => {
                    let Some(policy) = egress else {
                        return Err(ToolContextError::new(
                            key,
                            "`inject` needs the egress proxy, and this server has no sandbox.egress",
                        ));
                    };
                    let credential = warden_sandbox::egress::Credential::task(
                        policy,
                        &i.host,
                        &i.header,
                        &i.format,
                        &entry.value,
                        format!("tool_context.{name}"),
                    )
                    .map_err(|(field, why)| {
                        let why = match field {
                            warden_sandbox::egress::CredentialField::Value => format!("the value {why}"),
                            other => format!("inject.{}: {why}", other.name()),
                        };
                        ToolContextError::new(key, why)
                    })?;
                    out.inject.push(Arc::new(credential));
                }
            }
            out.named.push((name, entry.value.clone()));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(json: serde_json::Value) -> BTreeMap<String, Entry> {
        serde_json::from_value(json).unwrap()
    }

    fn policy() -> warden_sandbox::EgressPolicy {
        warden_sandbox::EgressConfig { allow: vec!["api.example.com".into()], ..Default::default() }
            .resolve(|_| None)
            .unwrap()
    }

    #[test]
    fn each_entry_names_its_delivery_and_a_string_is_never_exported() {
        let e = entries(serde_json::json!({
            "plain": "s3cret-plain",
            "api-token": { "value": "s3cret-env", "env": true },
            "gh": { "value": "s3cret-inject", "inject": { "host": "api.example.com", "header": "Authorization", "format": "Bearer {}" } },
        }));
        let s = TaskSecrets::of(&e, &["API_TOKEN".into()], Some(&policy())).unwrap();
        assert_eq!(s.env, vec![("API_TOKEN".to_string(), "s3cret-env".to_string())]);
        assert_eq!(s.named.len(), 3, "every entry can be named by an operator's ${{NAME}}");
        assert_eq!(s.inject.len(), 1);
        assert_eq!(s.inject[0].name(), "tool_context.GH");
        assert!(!format!("{e:?} {s:?}").contains("s3cret"), "Debug never shows a value");
    }

    #[test]
    fn refusals_name_the_key_and_why() {
        let cases = [
            (serde_json::json!({ "api-token": { "value": "v", "env": true } }), "api-token", "sandbox.task_env"),
            (serde_json::json!({ "bash_env": { "value": "v", "env": true } }), "bash_env", "changes how the shell"),
            (
                serde_json::json!({ "k": { "value": "v", "inject": { "host": "other.example.com", "header": "Authorization" } } }),
                "k",
                "inject.host",
            ),
            (
                serde_json::json!({ "k": { "value": "v", "inject": { "host": "*.example.com", "header": "Authorization" } } }),
                "k",
                "wildcard",
            ),
            (
                serde_json::json!({ "k": { "value": "v", "inject": { "host": "api.example.com", "header": "Proxy-Authorization" } } }),
                "k",
                "inject.header",
            ),
            (
                serde_json::json!({ "k": { "value": "a\nb", "inject": { "host": "api.example.com", "header": "X-Key" } } }),
                "k",
                "control characters",
            ),
            (serde_json::json!({ "a-b": "x", "A_B": "y" }), "a-b", "names the variable A_B too"),
            (serde_json::json!({ "": "x" }), "", "empty"),
        ];
        for (json, key, why) in cases {
            let e = TaskSecrets::of(&entries(json.clone()), &["BASH_ENV".into()], Some(&policy())).unwrap_err();
            assert_eq!(e.key, key, "{json}");
            assert!(
                e.to_string().contains(why) && e.to_string().contains(&format!("tool_context.{key}")),
                "{json}: {e}"
            );
        }
        let inject = entries(
            serde_json::json!({ "k": { "value": "v", "inject": { "host": "api.example.com", "header": "X" } } }),
        );
        let e = TaskSecrets::of(&inject, &[], None).unwrap_err();
        assert!(e.message.contains("sandbox.egress"), "{e}");
        let both: Result<BTreeMap<String, Entry>, _> = serde_json::from_value(
            serde_json::json!({ "k": { "value": "v", "env": true, "inject": { "host": "h", "header": "X" } } }),
        );
        assert!(both.unwrap_err().to_string().contains("choose one delivery"));
        let unknown: Result<BTreeMap<String, Entry>, _> =
            serde_json::from_value(serde_json::json!({ "k": { "value": "v", "export": true } }));
        assert!(unknown.is_err());
        let number: Result<BTreeMap<String, Entry>, _> = serde_json::from_value(serde_json::json!({ "k": 1 }));
        assert!(number.is_err());
    }
}
