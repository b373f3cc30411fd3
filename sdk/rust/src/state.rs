//! The small key/value store scoped to this plugin (the `state` import), so `resume`
//! can pick up what an earlier task left: bytes, or any serde value as JSON.

#[cfg(feature = "bindings")]
pub use imports::{delete, get, get_json, set, set_json};

#[cfg(feature = "bindings")]
mod imports {
    use serde::Serialize;
    use serde::de::DeserializeOwned;

    use crate::bindings::warden::plugin::state as wit;
    use crate::error::{Error, Result};

    pub fn get(key: &str) -> Result<Option<Vec<u8>>> {
        wit::get(key)
    }

    pub fn set(key: &str, value: &[u8]) -> Result<()> {
        wit::set(key, value)
    }

    pub fn delete(key: &str) -> Result<()> {
        wit::delete(key)
    }

    /// The value under `key` as `T`; a stored value of another shape is an `internal`
    /// error naming the key (the plugin wrote it).
    pub fn get_json<T: DeserializeOwned>(key: &str) -> Result<Option<T>> {
        get(key)?
            .map(|bytes| {
                serde_json::from_slice(&bytes)
                    .map_err(|e| Error::Internal(format!("state `{key}` is not the expected JSON: {e}")))
            })
            .transpose()
    }

    /// Stores `value` under `key` as JSON.
    pub fn set_json(key: &str, value: &impl Serialize) -> Result<()> {
        let bytes =
            serde_json::to_vec(value).map_err(|e| Error::Internal(format!("serialising state `{key}`: {e}")))?;
        set(key, &bytes)
    }
}
