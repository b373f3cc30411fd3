//! Outbound HTTP through the host's `http` import: plain [`Request`]/[`Response`] values
//! (usable in native tests of a plugin's protocol code), JSON bodies both ways, status
//! checks whose errors quote a bounded excerpt of the body, and (with the `bindings`
//! feature) [`send`], [`send_streaming`] and [`send_json`] over the import.
//!
//! The host enforces the operator's allow-list, the response size limit and the call's
//! deadline; a refused call comes back as `Error::Denied` naming the capability.

pub use crate::wire::http::*;

#[cfg(feature = "bindings")]
pub use imports::{BodyStream, send, send_json, send_streaming};

#[cfg(feature = "bindings")]
mod imports {
    use serde::de::DeserializeOwned;

    use super::{Request, Response, StreamHead};
    use crate::bindings::warden::plugin::http as wit;
    use crate::error::{Error, Result};

    /// Sends `req` and reads the whole response.
    pub fn send(req: &Request) -> Result<Response> {
        wit::send(req)
    }

    /// Sends `req`, checks for a 2xx status and reads the body as `T` (errors name the URL).
    pub fn send_json<T: DeserializeOwned>(req: &Request) -> Result<T> {
        send(req)?.error_for_status(&req.url)?.json()
    }

    /// Sends `req` and returns the head and a stream of the body's chunks (server-sent
    /// events, large bodies).
    pub fn send_streaming(req: &Request) -> Result<(StreamHead, BodyStream)> {
        let (head, body) = wit::send_streaming(req)?;
        Ok((head, BodyStream(body)))
    }

    /// A response body read in chunks.
    pub struct BodyStream(wit::BodyStream);

    impl BodyStream {
        /// The next chunk, or `None` at the end of the body.
        pub fn next_chunk(&mut self) -> Result<Option<Vec<u8>>> {
            self.0.next()
        }

        /// The rest of the body, refused (`remote`) once it passes `max_bytes`.
        pub fn read_to_end(mut self, max_bytes: usize) -> Result<Vec<u8>> {
            let mut out = Vec::new();
            while let Some(chunk) = self.next_chunk()? {
                if out.len() + chunk.len() > max_bytes {
                    return Err(Error::Remote(format!("the response body is larger than {max_bytes} bytes")));
                }
                out.extend_from_slice(&chunk);
            }
            Ok(out)
        }
    }
}
