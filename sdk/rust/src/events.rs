//! Progress events into the task's event stream (the `events` import): `kind` is an
//! event type (`progress`, `token`, `reasoning`, `status`, ...), the data a JSON object.

use serde::Serialize;

use crate::error::{Error, Result};

/// `data` as the JSON text an event carries.
pub fn encode(data: &impl Serialize) -> Result<String> {
    serde_json::to_string(data).map_err(|e| Error::Internal(format!("serialising event data: {e}")))
}

/// Emits one event with `data` serialised as JSON.
#[cfg(feature = "bindings")]
pub fn emit(kind: &str, data: &impl Serialize) -> Result<()> {
    emit_raw(kind, &encode(data)?)
}

/// Emits one event whose data is already JSON text.
#[cfg(feature = "bindings")]
pub fn emit_raw(kind: &str, json: &str) -> Result<()> {
    crate::bindings::warden::plugin::events::emit(kind, json)
}
