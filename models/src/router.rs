//! Model names → providers.
//!
//! A name is resolved in this order:
//! 1. nothing, an empty string or `inherit` → `models.default`;
//! 2. a key of `models.aliases` → its target (aliases may point at aliases, up to
//!    [`MAX_ALIAS_DEPTH`] hops);
//! 3. `sonnet`, `opus`, `haiku` not listed in `aliases` → `models.default` (Claude agent
//!    files name these; an operator without Anthropic still gets a working agent);
//! 4. `provider/model` with a configured provider → that provider and `model` (which may
//!    itself contain `/`, e.g. `local/meta-llama/Llama-3.1-8B`).
//!
//! Anything else is [`ModelError::UnknownModel`], listing what is available.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::anthropic::{AnthropicOptions, AnthropicProvider, DEFAULT_ANTHROPIC_BASE_URL};
use crate::config::{ModelsConfig, ProviderConfig, ProviderKind};
use crate::openai::{DEFAULT_OPENAI_BASE_URL, OpenAiOptions, OpenAiProvider};
use crate::scripted::ScriptedProvider;
use crate::{DEFAULT_REQUEST_TIMEOUT, ModelError, Provider};

/// How many alias → alias hops are followed before giving up (cycles).
pub const MAX_ALIAS_DEPTH: usize = 8;

/// Claude model shorthands that fall back to the default model when not aliased.
pub const CLAUDE_SHORTHANDS: [&str; 3] = ["sonnet", "opus", "haiku"];

/// Resolves model names to providers. Cheap to share (`Arc` inside).
#[derive(Clone)]
pub struct ModelRouter {
    default: String,
    aliases: BTreeMap<String, String>,
    providers: BTreeMap<String, Arc<dyn Provider>>,
}

impl std::fmt::Debug for ModelRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelRouter")
            .field("default", &self.default)
            .field("aliases", &self.aliases)
            .field("providers", &self.providers.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Build one provider from its configuration. `base_dir` anchors relative `script` paths.
pub fn build_provider(key: &str, cfg: &ProviderConfig, base_dir: &Path) -> Result<Arc<dyn Provider>, ModelError> {
    cfg.validate(key)?;
    let timeout = cfg.timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT);
    Ok(match cfg.kind {
        ProviderKind::Openai => {
            let api_key_env = cfg.key_env().map(str::to_owned);
            let base_url = cfg.base_url.clone().unwrap_or_else(|| DEFAULT_OPENAI_BASE_URL.into());
            Arc::new(OpenAiProvider::new(OpenAiOptions { name: key.into(), base_url, api_key_env, timeout })?)
        }
        ProviderKind::Anthropic => {
            let api_key_env = cfg.key_env().map(str::to_owned);
            let base_url = cfg.base_url.clone().unwrap_or_else(|| DEFAULT_ANTHROPIC_BASE_URL.into());
            Arc::new(AnthropicProvider::new(AnthropicOptions { name: key.into(), base_url, api_key_env, timeout })?)
        }
        ProviderKind::Scripted => {
            let script = cfg.script.as_deref().expect("validated: scripted has a script");
            let path = if script.is_absolute() { script.to_owned() } else { base_dir.join(script) };
            Arc::new(ScriptedProvider::load(key, &path)?)
        }
    })
}

impl ModelRouter {
    /// Build every configured provider and check that `default` and every alias point at
    /// a configured provider. With no providers at all, nothing is checked and every
    /// [`resolve`](Self::resolve) fails with a clear error.
    pub fn from_config(cfg: &ModelsConfig, base_dir: &Path) -> Result<Self, ModelError> {
        let mut providers = BTreeMap::new();
        for (key, p) in &cfg.providers {
            if key.is_empty() || key.contains('/') {
                return Err(ModelError::Config(format!(
                    "models.providers: provider key `{key}` must be non-empty and contain no `/`"
                )));
            }
            providers.insert(key.clone(), build_provider(key, p, base_dir)?);
        }
        let router = Self { default: cfg.default.trim().to_owned(), aliases: cfg.aliases.clone(), providers };
        if !router.providers.is_empty() {
            router.resolve(None).map_err(|e| ModelError::Config(format!("models.default `{}`: {e}", cfg.default)))?;
            for alias in cfg.aliases.keys() {
                router.resolve(Some(alias)).map_err(|e| ModelError::Config(format!("models.aliases.{alias}: {e}")))?;
            }
        }
        Ok(router)
    }

    /// A router over explicitly given providers (host tests, embedded defaults).
    pub fn new(default: impl Into<String>) -> Self {
        Self { default: default.into(), aliases: BTreeMap::new(), providers: BTreeMap::new() }
    }

    /// Add or replace a provider under `key`.
    pub fn with_provider(mut self, key: impl Into<String>, provider: Arc<dyn Provider>) -> Self {
        self.providers.insert(key.into(), provider);
        self
    }

    /// Add or replace an alias.
    pub fn with_alias(mut self, alias: impl Into<String>, target: impl Into<String>) -> Self {
        self.aliases.insert(alias.into(), target.into());
        self
    }

    /// The `provider/model` used when nothing else is named.
    pub fn default_model(&self) -> &str {
        &self.default
    }

    /// Configured provider keys, sorted.
    pub fn provider_names(&self) -> impl Iterator<Item = &str> {
        self.providers.keys().map(String::as_str)
    }

    /// Configured providers by key, sorted.
    pub fn providers(&self) -> impl Iterator<Item = (&str, &Arc<dyn Provider>)> {
        self.providers.iter().map(|(k, p)| (k.as_str(), p))
    }

    /// The provider and provider-local model name for `name` (see the module docs).
    pub fn resolve(&self, name: Option<&str>) -> Result<(Arc<dyn Provider>, String), ModelError> {
        let asked = name.map(str::trim).unwrap_or_default();
        let mut current = asked.to_owned();
        for _ in 0..=MAX_ALIAS_DEPTH {
            if current.is_empty() || current == "inherit" {
                current = self.default.clone();
                if current.is_empty() {
                    return Err(self.unknown(asked, "no `models.default` is configured"));
                }
            }
            if let Some(target) = self.aliases.get(&current) {
                current = target.trim().to_owned();
                continue;
            }
            if CLAUDE_SHORTHANDS.contains(&current.as_str()) {
                current = self.default.clone();
                continue;
            }
            let Some((provider, model)) = current.split_once('/') else {
                return Err(self.unknown(asked, &format!("`{current}` is not `provider/model` nor an alias")));
            };
            let Some(p) = self.providers.get(provider) else {
                return Err(self.unknown(asked, &format!("no provider `{provider}` is configured")));
            };
            if model.trim().is_empty() {
                return Err(self.unknown(asked, &format!("`{current}` names no model after the `/`")));
            }
            return Ok((p.clone(), model.to_owned()));
        }
        Err(self.unknown(asked, &format!("aliases nest deeper than {MAX_ALIAS_DEPTH} (a cycle?)")))
    }

    fn unknown(&self, asked: &str, why: &str) -> ModelError {
        let providers: Vec<String> = self.providers.keys().map(|k| format!("{k}/<model>")).collect();
        let mut aliases: Vec<&str> = self.aliases.keys().map(String::as_str).collect();
        for s in CLAUDE_SHORTHANDS.iter().chain(&["inherit"]) {
            if !aliases.contains(s) {
                aliases.push(s);
            }
        }
        let available = if self.providers.is_empty() {
            format!("{why}; no model providers are configured (models.providers is empty)")
        } else {
            format!(
                "{why}; available: providers [{}], aliases [{}], default `{}`",
                providers.join(", "),
                aliases.join(", "),
                self.default
            )
        };
        ModelError::UnknownModel { name: if asked.is_empty() { "(default)".into() } else { asked.into() }, available }
    }
}
