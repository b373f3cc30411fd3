//! Definition resources (the `resources` import): files under the operator's agent
//! directories or allowed URLs.

#[cfg(feature = "bindings")]
pub use imports::{read, read_text};

#[cfg(feature = "bindings")]
mod imports {
    use crate::error::{Error, Result};

    /// The resource's bytes; errors carry the host's case (`not-found`, `denied`, ...).
    pub fn read(uri: &str) -> Result<Vec<u8>> {
        crate::bindings::warden::plugin::resources::read(uri)
    }

    /// The resource as UTF-8 text; errors name the URI.
    pub fn read_text(uri: &str) -> Result<String> {
        let bytes = read(uri).map_err(|e| e.context(uri))?;
        String::from_utf8(bytes).map_err(|e| Error::from(e).context(uri))
    }
}
