//! A blocking driver over [`Session`] for callers with a synchronous transport (the
//! wasm plugin). Async callers (the host) run the same steps with their own I/O; see
//! the crate docs.

use serde_json::Value;

use crate::error::McpError;
use crate::exchange::{HttpRequest, Pending, Update};
use crate::limits::{ListLimits, Listing};
use crate::session::{ClientInfo, Era, Preference, ServerInfo, Session};
use crate::tools::{Tool, ToolResult};

/// A streamed HTTP reply body.
pub trait Body {
    /// The next chunk, or `None` at end of body.
    fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, McpError>;
}

/// Header name/value pairs.
pub type Headers = Vec<(String, String)>;

/// Moves one request to the endpoint and returns the reply's status, headers and body.
pub trait Transport {
    type Body: Body;
    fn send(&mut self, request: &HttpRequest) -> Result<(u16, Headers, Self::Body), McpError>;
}

pub struct Client<T: Transport> {
    transport: T,
    session: Session,
}

impl<T: Transport> Client<T> {
    pub fn new(transport: T, client: ClientInfo, preference: Preference) -> Self {
        Client { transport, session: Session::new(client).with_preference(preference) }
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }

    /// Negotiates the revision (discover, falling back to initialize).
    pub fn connect(&mut self) -> Result<&ServerInfo, McpError> {
        let mut next = Some(self.session.connect());
        while let Some((request, mut pending)) = next {
            self.exchange(&request, &mut pending, &mut |_| {})?;
            next = self.session.advance(pending)?;
        }
        self.session.server().ok_or_else(|| McpError::Protocol("negotiation ended without a server".into()))
    }

    /// Every tool, following `nextCursor`, held to the listing bounds ([`ListLimits`]
    /// defaults; tools over them are left out).
    pub fn list_all_tools(&mut self) -> Result<Vec<Tool>, McpError> {
        let mut listing = Listing::new(ListLimits::default());
        let mut cursor: Option<String> = None;
        loop {
            let (request, mut pending) = self.session.list_tools(cursor.as_deref())?;
            pending.limit_bytes(listing.remaining_bytes());
            self.exchange(&request, &mut pending, &mut |_| {})?;
            cursor = listing.add(pending.body_bytes(), pending.result()?)?;
            if cursor.is_none() {
                return Ok(listing.finish().0);
            }
        }
    }

    /// `tools/call`; `on_update` sees progress and other notifications as they arrive.
    pub fn call_tool(
        &mut self,
        name: &str,
        arguments: Value,
        progress_token: Option<Value>,
        on_update: &mut dyn FnMut(Update),
    ) -> Result<ToolResult, McpError> {
        let (request, mut pending) = self.session.call_tool(name, arguments, progress_token)?;
        self.exchange(&request, &mut pending, on_update)?;
        ToolResult::from_result(pending.result()?)
    }

    /// Ends a handshake-era session, ignoring failures.
    pub fn close(&mut self) {
        if let Some(request) = self.session.close()
            && let Ok((_, _, mut body)) = self.transport.send(&request)
        {
            let _ = body.next_chunk();
        }
    }

    /// True when the session is a handshake-era one with a session id.
    pub fn has_session_id(&self) -> bool {
        matches!(self.session.era(), Some(Era::Handshake { session_id: Some(_), .. }))
    }

    fn exchange(
        &mut self,
        request: &HttpRequest,
        pending: &mut Pending,
        on_update: &mut dyn FnMut(Update),
    ) -> Result<(), McpError> {
        let (status, headers, mut body) = self.transport.send(request)?;
        pending.begin(status, &headers);
        while !pending.is_done() {
            match body.next_chunk()? {
                Some(chunk) => pending.feed(&chunk).into_iter().for_each(&mut *on_update),
                None => break,
            }
        }
        pending.finish().into_iter().for_each(&mut *on_update);
        Ok(())
    }
}
