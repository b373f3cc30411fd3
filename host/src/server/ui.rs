//! The operator console at `/ui`: one HTML page, one script and one stylesheet embedded in
//! the binary (no build step, no CDN), served without a token (exactly its own paths,
//! [`is_ui_path`]; this module must never exempt a path by prefix). Everything it shows comes
//! from the API with the token the person signs in with, which the page keeps in
//! `sessionStorage` of this origin and sends as `Authorization: Bearer` — never in a
//! cookie, so the browser never attaches it on its own and no other site can make a
//! request with it (no CSRF path). A strict Content-Security-Policy allows only this
//! origin's script and style (no inline script, no `eval`, no framing).

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::AppState;

/// The console's Content-Security-Policy: this origin's script, style, images and API
/// only; nothing inline, nothing framed, no `<base>`, no form posts elsewhere.
pub const UI_CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

const INDEX_HTML: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const APP_CSS: &str = include_str!("ui/app.css");
const FAVICON_SVG: &str = include_str!("ui/favicon.svg");

/// Every path of the console with its content type and body: the routes, and the only
/// paths served without a token (exactly these, byte for byte: nothing under `/ui/` that
/// is not listed, and no spelling of another path with dot segments, doubled slashes,
/// backslashes or percent-escapes, is exempt).
const ASSETS: [(&str, &str, &str); 5] = [
    ("/ui", "text/html; charset=utf-8", INDEX_HTML),
    ("/ui/", "text/html; charset=utf-8", INDEX_HTML),
    ("/ui/app.js", "text/javascript; charset=utf-8", APP_JS),
    ("/ui/app.css", "text/css; charset=utf-8", APP_CSS),
    ("/ui/favicon.svg", "image/svg+xml", FAVICON_SVG),
];

/// The console's routes, merged into [`super::app`].
pub fn routes() -> Router<AppState> {
    ASSETS.iter().fold(Router::new(), |router, &(path, content_type, body)| {
        router.route(path, get(move || async move { asset(content_type, body) }))
    })
}

/// Whether `path` is one of the console's own (served without a token; the API calls the
/// page makes carry one).
pub fn is_ui_path(path: &str) -> bool {
    ASSETS.iter().any(|(p, _, _)| *p == path)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(UI_CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // A new binary serves new assets: revalidate instead of running a stale script.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_console_paths_are_public() {
        for p in ["/ui", "/ui/", "/ui/app.js", "/ui/app.css", "/ui/favicon.svg"] {
            assert!(is_ui_path(p), "{p}");
        }
        for p in [
            "/uix",
            "/v1/ui",
            "/",
            "/ui.js",
            "/ui/nothing-here",
            "/ui/../v1/tasks",
            "/ui/%2e%2e/v1/tasks",
            "/ui//..",
            "/ui/..\\v1\\tasks",
            "/ui/app.js/../../v1/tasks",
            "/UI/app.js",
        ] {
            assert!(!is_ui_path(p), "{p}");
        }
    }

    #[test]
    fn the_page_loads_no_inline_or_foreign_script() {
        assert!(!INDEX_HTML.contains("<script>") && !INDEX_HTML.contains("style="), "inline code in index.html");
        assert!(!INDEX_HTML.contains("http://") && !INDEX_HTML.contains("https://"), "a foreign origin in index.html");
        assert!(!APP_JS.contains("innerHTML") && !APP_JS.contains("eval("), "app.js builds the DOM with text only");
        assert!(
            !APP_JS.contains("localStorage") && !APP_JS.contains("document.cookie"),
            "the token stays in sessionStorage"
        );
    }
}
