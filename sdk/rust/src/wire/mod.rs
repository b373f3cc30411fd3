//! The plain Rust twins of the WIT records that cross the boundary as they are (the
//! generated bindings name these types with `with`, so no conversion code exists). The
//! bottom layer of the SDK: it calls nothing and imports no bindings, so the bindings, the
//! host-call wrappers ([`crate::http`], [`crate::model`]) and a plugin's native tests all
//! build on it.

pub mod http;
pub mod model;
