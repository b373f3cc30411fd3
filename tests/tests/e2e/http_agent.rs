//! The `http` plugin against a local HTTP server started by the test: templating and
//! extraction, non-2xx, timeout, malformed JSON, and a header secret that the host
//! injects and that never shows in the output or the debug logs.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Deployment, bin, bundled_plugin, json};

/// What the server saw: (method, path, headers lowercased, body).
type Seen = Arc<Mutex<Vec<(String, String, Vec<(String, String)>, String)>>>;

/// A tiny HTTP/1.1 server on a thread: `/ok` answers `{"answer":{"text":"got: <q>"}}`,
/// `/fail` 503, `/slow` sleeps 20 s, `/html` returns HTML.
fn server() -> (u16, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let log = log.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let mut parts = line.split_whitespace();
                let (method, path) = (parts.next().unwrap_or("").to_owned(), parts.next().unwrap_or("").to_owned());
                let mut headers = Vec::new();
                loop {
                    let mut h = String::new();
                    reader.read_line(&mut h).unwrap();
                    let h = h.trim_end();
                    if h.is_empty() {
                        break;
                    }
                    if let Some((k, v)) = h.split_once(':') {
                        headers.push((k.trim().to_lowercase(), v.trim().to_owned()));
                    }
                }
                let len = headers.iter().find(|(k, _)| k == "content-length").map_or(0, |(_, v)| v.parse().unwrap());
                let mut body = vec![0; len];
                reader.read_exact(&mut body).unwrap();
                let body = String::from_utf8_lossy(&body).into_owned();
                log.lock().unwrap().push((method, path.clone(), headers, body.clone()));
                let (status, ctype, reply) = match path.as_str() {
                    "/ok" => {
                        let q = serde_json::from_str::<serde_json::Value>(&body)
                            .map(|v| v["q"].clone())
                            .unwrap_or_default();
                        let text = format!("got: {}", q.as_str().unwrap_or("?"));
                        ("200 OK", "application/json", serde_json::json!({"answer": {"text": text}}).to_string())
                    }
                    "/fail" => ("503 Service Unavailable", "text/plain", "backend overloaded, try later".to_owned()),
                    "/slow" => {
                        std::thread::sleep(Duration::from_secs(20));
                        ("200 OK", "text/plain", "too late".to_owned())
                    }
                    _ => ("200 OK", "text/html", "<html><body>not json</body></html>".to_owned()),
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
                    reply.len()
                );
            });
        }
    });
    (port, seen)
}

const SECRET: &str = "s3cr3t-token-4b1d9e";

fn deployment(port: u16) -> Deployment {
    let base = format!("http://127.0.0.1:{port}");
    let d = Deployment::new(&format!(
        "  limits: {{ timeout: 10s }}\n  grants:\n    http:\n      http: [\"http://127.0.0.1:*\"]\n      log: true\n      secrets: {{ API_TOKEN: {{ env: WARDEN_E2E_HTTP_TOKEN, origins: [\"http://127.0.0.1:*\"] }} }}\n\
         subagents:\n  references:\n\
         \x20   - uri: \"{base}/ok\"\n      kind: HTTP\n      metadata:\n        name: helper\n        description: Answers over HTTP\n\
         \x20       headers: \"X-Team: blue\\nAuthorization: env:API_TOKEN\"\n\
         \x20       body: '{{\"q\": \"{{{{prompt}}}}\", \"d\": \"{{{{description}}}}\"}}'\n        response_pointer: /answer/text\n\
         \x20   - {{ uri: \"{base}/fail\", kind: HTTP, metadata: {{ name: failing }} }}\n\
         \x20   - {{ uri: \"{base}/slow\", kind: HTTP, metadata: {{ name: slow, timeout: 1s }} }}\n\
         \x20   - {{ uri: \"{base}/html\", kind: HTTP, metadata: {{ name: html, response_pointer: /answer }} }}\n"
    ));
    std::fs::copy(bundled_plugin("http"), d.dir.path().join("plugins/http.wasm")).unwrap();
    d
}

fn run(d: &Deployment, args: &[&str]) -> Output {
    Command::new(bin())
        .current_dir(d.dir.path())
        .env("WARDEN_E2E_HTTP_TOKEN", SECRET)
        .env("WARDEN_LOG", "debug")
        .arg("--config")
        .arg(d.dir.path().join("warden.yaml"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn http_agent_templating_extraction_and_secret_by_reference() {
    let (port, seen) = server();
    let d = deployment(port);
    let prompt = "say \"hi\"\n\tand {{description}} \\ done";
    let out = run(&d, &["run", "helper", prompt, "--description", "greet them", "--json"]);
    let v = json(&out);
    assert_eq!(v["status"], "completed", "{v}\nstderr: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(v["output"], format!("got: {prompt}"));

    let seen = seen.lock().unwrap();
    let (method, path, headers, body) = seen.iter().find(|r| r.1 == "/ok").expect("no request to /ok");
    assert_eq!((method.as_str(), path.as_str()), ("POST", "/ok"));
    let body: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(body, serde_json::json!({"q": prompt, "d": "greet them"}));
    let header = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    assert_eq!(header("authorization"), Some(format!("Bearer {SECRET}").as_str()));
    assert_eq!(header("x-team"), Some("blue"));
    assert_eq!(header("content-type"), Some("application/json"));

    // The secret is in no output, even at debug log level.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stderr.contains("DEBUG"), "expected debug logs on stderr");
    assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET), "secret leaked:\n{stdout}\n{stderr}");
    let agents = run(&d, &["agents", "--json"]);
    assert!(!String::from_utf8_lossy(&agents.stdout).contains(SECRET));
    assert!(!String::from_utf8_lossy(&agents.stderr).contains(SECRET));
    for entry in walk(d.dir.path()) {
        let bytes = std::fs::read(&entry).unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains(SECRET), "secret written to {}", entry.display());
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

#[test]
fn http_agent_non_2xx_is_a_failure_with_status_and_excerpt() {
    let (port, _) = server();
    let d = deployment(port);
    let v = json(&run(&d, &["run", "failing", "x", "--json"]));
    assert_eq!(v["status"], "failed", "{v}");
    assert!(v["error"].as_str().unwrap().contains("HTTP 503: backend overloaded, try later"), "{v}");
}

#[test]
fn http_agent_timeout() {
    let (port, _) = server();
    let d = deployment(port);
    let started = Instant::now();
    let v = json(&run(&d, &["run", "slow", "x", "--json"]));
    assert_eq!(v["status"], "failed", "{v}");
    assert!(v["error"].as_str().unwrap().contains("timed out"), "{v}");
    assert!(started.elapsed() < Duration::from_secs(8), "the 1 s timeout was not honoured: {:?}", started.elapsed());
}

#[test]
fn http_agent_malformed_json_with_a_pointer() {
    let (port, _) = server();
    let d = deployment(port);
    let v = json(&run(&d, &["run", "html", "x", "--json"]));
    assert_eq!(v["status"], "failed", "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(e.contains("not valid JSON") && e.contains("/answer") && e.contains("<html>"), "{v}");
}

#[test]
fn http_agent_refuses_secrets_in_other_headers() {
    let d = Deployment::new(
        "  grants:\n    http: { http: [\"http://127.0.0.1:*\"] }\nsubagents:\n  references:\n    - { uri: \"http://127.0.0.1:9/x\", kind: HTTP, metadata: { headers: \"X-Api-Key: env:KEY\" } }\n",
    );
    std::fs::copy(bundled_plugin("http"), d.dir.path().join("plugins/http.wasm")).unwrap();
    let v = json(&d.warden(&["agents", "--json"]));
    assert!(v["problems"].to_string().contains("only supported in `Authorization`"), "{v}");
}
