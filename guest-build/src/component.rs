//! Core module → component, in-process with `wit-component` (no wasm-tools needed).

use std::fs;
use std::path::Path;

use crate::{Error, Result, write_atomically};

/// Encodes the core module at `core` (with wit-bindgen's component-type section) into a
/// validated component and writes it atomically to `out`.
pub fn encode_component(core: &Path, out: &Path) -> Result<()> {
    let bytes = fs::read(core).map_err(Error::io("reading", core))?;
    let component = wit_component::ComponentEncoder::default()
        .module(&bytes)
        .and_then(|encoder| encoder.validate(true).encode())
        .map_err(|e| Error::Encode { core: core.to_path_buf(), detail: format!("{e:#}") })?;
    write_atomically(out, &component)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest core module: the magic number and version 1.
    const EMPTY_MODULE: &[u8] = b"\0asm\x01\0\0\0";

    #[test]
    fn encodes_a_module_into_a_component() {
        let dir = tempfile::tempdir().unwrap();
        let core = dir.path().join("core.wasm");
        let out = dir.path().join("out.wasm");
        fs::write(&core, EMPTY_MODULE).unwrap();
        encode_component(&core, &out).unwrap();
        let component = fs::read(&out).unwrap();
        // A component's preamble: the magic number, version 0x0d, layer 1.
        assert_eq!(&component[..8], b"\0asm\x0d\0\x01\0", "{component:?}");
    }

    #[test]
    fn a_bad_module_is_an_error_naming_it_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let core = dir.path().join("core.wasm");
        let out = dir.path().join("out.wasm");
        fs::write(&core, b"not wasm").unwrap();
        let err = encode_component(&core, &out).unwrap_err();
        assert!(matches!(err, Error::Encode { .. }), "{err:?}");
        assert!(err.to_string().contains("core.wasm"), "{err}");
        assert!(!out.exists());
        assert_eq!(std::fs::read_dir(out.parent().unwrap()).unwrap().count(), 1, "only the input is left");
        let err = encode_component(&dir.path().join("missing.wasm"), &out).unwrap_err();
        assert!(err.to_string().starts_with("reading ") && err.to_string().contains("missing.wasm"), "{err}");
    }
}
