//! The `models:` section of `warden.yaml`.
//!
//! ```yaml
//! models:
//!   default: demo/scripted      # provider/model
//!   aliases: { sonnet: claude/claude-sonnet-4-5, haiku: local/qwen3 }
//!   providers:
//!     local:  { type: openai, base_url: "http://127.0.0.1:8000/v1" }           # no key
//!     openai: { type: openai, api_key_env: OPENAI_API_KEY, timeout: 120s }    # base_url defaults to api.openai.com
//!     claude: { type: anthropic, api_key_env: ANTHROPIC_API_KEY }
//!     demo:   { type: scripted, script: ./demo/script.yaml }                  # relative to the config file
//! ```
//!
//! Unknown keys are errors. `api_key_env` names an environment variable; the key itself
//! never appears in configuration. For `openai`, no `api_key_env` (or `null`) means no
//! key is sent (local servers); for `anthropic`, a missing `api_key_env` means
//! `ANTHROPIC_API_KEY` and `null` means none (a local fake or gateway).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use crate::ModelError;

/// `models:` — compatible with the host's `ModelsConfig` (whose `providers` values are
/// untyped YAML; see [`ProviderConfig::from_yaml`]).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelsConfig {
    /// `provider/model` used when neither the task nor the agent names a model.
    pub default: String,
    /// Short names → `provider/model`. `sonnet`, `opus` and `haiku` fall back to
    /// `default` when not listed; `inherit` always means `default`.
    pub aliases: BTreeMap<String, String>,
    /// Provider key → provider settings.
    pub providers: BTreeMap<String, ProviderConfig>,
}

/// The built-in default model: the offline scripted demo provider.
pub const DEFAULT_MODEL: &str = "demo/scripted";

impl Default for ModelsConfig {
    fn default() -> Self {
        Self { default: DEFAULT_MODEL.into(), aliases: BTreeMap::new(), providers: BTreeMap::new() }
    }
}

impl ModelsConfig {
    /// Parse a `models:` mapping from YAML text (errors say where).
    pub fn from_yaml_str(text: &str) -> Result<Self, ModelError> {
        serde_yaml::from_str(text).map_err(|e| ModelError::Config(format!("models: {e}")))
    }
}

/// Which protocol a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// OpenAI-compatible chat completions.
    Openai,
    /// Anthropic Messages API.
    Anthropic,
    /// Turns replayed from a YAML script (offline).
    Scripted,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Scripted => "scripted",
        }
    }
}

/// `api_key_env` as written: absent, explicitly `null`, or a variable name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ApiKeyEnv {
    /// Key not mentioned: the provider type's default applies.
    #[default]
    Unset,
    /// `api_key_env: null` — send no key.
    None,
    /// The environment variable holding the key.
    Var(String),
}

impl ApiKeyEnv {
    fn is_unset(&self) -> bool {
        matches!(self, ApiKeyEnv::Unset)
    }
}

fn de_api_key_env<'de, D: Deserializer<'de>>(d: D) -> Result<ApiKeyEnv, D::Error> {
    // Only called when the key is present, so `None` here means an explicit `null`.
    Ok(match Option::<String>::deserialize(d)? {
        None => ApiKeyEnv::None,
        Some(v) if v.trim().is_empty() => ApiKeyEnv::None,
        Some(v) => ApiKeyEnv::Var(v),
    })
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(s) => humantime::parse_duration(s.trim())
            .map(Some)
            .map_err(|e| serde::de::Error::custom(format!("invalid duration `{s}` ({e}); expected e.g. `30s`, `2m`"))),
    }
}

fn ser_duration<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&humantime::format_duration(*d).to_string()),
        None => s.serialize_none(),
    }
}

/// One entry of `models.providers`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    #[serde(rename = "type")]
    pub kind: ProviderKind,
    /// API root. `openai`: up to but excluding `/chat/completions` (default
    /// `https://api.openai.com/v1`); `anthropic`: up to but excluding `/v1/messages`
    /// (default `https://api.anthropic.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// Environment variable holding the API key.
    #[serde(default, deserialize_with = "de_api_key_env", skip_serializing_if = "ApiKeyEnv::is_unset")]
    pub api_key_env: ApiKeyEnv,
    /// `scripted` only: the YAML script, relative to the configuration file's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<PathBuf>,
    /// Deadline per completion (e.g. `120s`); default [`crate::DEFAULT_REQUEST_TIMEOUT`].
    #[serde(
        default,
        deserialize_with = "de_duration",
        serialize_with = "ser_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout: Option<Duration>,
}

impl ProviderConfig {
    /// The environment variable the provider's API key is read from: `api_key_env`, else
    /// the type's default (`ANTHROPIC_API_KEY` for `anthropic`; none for `openai`, whose
    /// local servers often need no key); none for `api_key_env: null` and for `scripted`.
    /// The one place this is decided: the provider reads its key from it, and the host
    /// registers the value with its scrubber.
    pub fn key_env(&self) -> Option<&str> {
        match (&self.kind, &self.api_key_env) {
            (ProviderKind::Scripted, _) | (_, ApiKeyEnv::None) => None,
            (_, ApiKeyEnv::Var(v)) => Some(v.as_str()),
            (ProviderKind::Anthropic, ApiKeyEnv::Unset) => Some(crate::anthropic::DEFAULT_ANTHROPIC_KEY_ENV),
            (ProviderKind::Openai, ApiKeyEnv::Unset) => None,
        }
    }

    /// Parse one provider entry (as the host holds it, untyped) with errors naming `key`.
    pub fn from_yaml(key: &str, value: serde_yaml::Value) -> Result<Self, ModelError> {
        serde_yaml::from_value(value).map_err(|e| ModelError::Config(format!("models.providers.{key}: {e}")))
    }

    /// Check the entry's fields fit its type; errors name `key`.
    pub fn validate(&self, key: &str) -> Result<(), ModelError> {
        let bad = |what: &str| {
            Err(ModelError::Config(format!("models.providers.{key} (type {}): {what}", self.kind.as_str())))
        };
        match self.kind {
            ProviderKind::Scripted => {
                if self.script.is_none() {
                    return bad("`script` is required (path to the YAML script of turns)");
                }
                if self.base_url.is_some() || !self.api_key_env.is_unset() {
                    return bad("`base_url` and `api_key_env` do not apply to a scripted provider");
                }
            }
            ProviderKind::Openai | ProviderKind::Anthropic => {
                if self.script.is_some() {
                    return bad("`script` applies only to `type: scripted`");
                }
                if let Some(url) = &self.base_url
                    && !(url.starts_with("http://") || url.starts_with("https://"))
                {
                    return bad(&format!("`base_url` must start with http:// or https://, got `{url}`"));
                }
            }
        }
        if self.timeout == Some(Duration::ZERO) {
            return bad("`timeout` must be greater than zero");
        }
        Ok(())
    }
}
