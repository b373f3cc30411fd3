//! `GET /metrics`: Prometheus text exposition, written by hand from the engine's
//! counters (no registry crate needed for a dozen series), every sample labelled with the
//! replica id when the server is one of several, and the middleware that counts HTTP
//! responses.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::AppState;
use crate::engine::DURATION_BUCKETS;

pub async fn count_requests(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let m = &state.engine.metrics;
    m.http_requests.fetch_add(1, Ordering::Relaxed);
    if resp.status().is_client_error() {
        m.http_client_errors.fetch_add(1, Ordering::Relaxed);
    } else if resp.status().is_server_error() {
        m.http_server_errors.fetch_add(1, Ordering::Relaxed);
    }
    resp
}

fn series(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(&str, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, v) in samples {
        let _ = writeln!(out, "{name}{labels} {v}");
    }
}

pub fn render(state: &AppState) -> String {
    let engine = &state.engine;
    let m = &engine.metrics;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let snap = engine.registry().snapshot();
    let pending = engine.gate().pending().len() as u64;
    let mut out = String::new();
    series(&mut out, "warden_tasks_submitted_total", "counter", "Tasks accepted.", &[("", get(&m.submitted))]);
    series(
        &mut out,
        "warden_tasks_rejected_total",
        "counter",
        "Task submissions refused (invalid or queue full).",
        &[("", get(&m.rejected))],
    );
    series(
        &mut out,
        "warden_tasks_finished_total",
        "counter",
        "Tasks finished, by final status.",
        &[
            ("{status=\"completed\"}", get(&m.completed)),
            ("{status=\"failed\"}", get(&m.failed)),
            ("{status=\"canceled\"}", get(&m.canceled)),
            ("{status=\"input_required\"}", get(&m.input_required)),
        ],
    );
    series(&mut out, "warden_tasks_running", "gauge", "Tasks running now.", &[("", get(&m.running))]);
    series(&mut out, "warden_tasks_queued", "gauge", "Tasks waiting for a slot.", &[("", get(&m.queued))]);
    series(
        &mut out,
        "warden_tasks_max_concurrent",
        "gauge",
        "Configured concurrency limit.",
        &[("", engine.options().max_concurrent_tasks as u64)],
    );
    let _ = writeln!(out, "# HELP warden_task_duration_seconds Run time of finished tasks.");
    let _ = writeln!(out, "# TYPE warden_task_duration_seconds histogram");
    for (i, b) in DURATION_BUCKETS.iter().enumerate() {
        let _ = writeln!(out, "warden_task_duration_seconds_bucket{{le=\"{b}\"}} {}", get(&m.duration_buckets[i]));
    }
    let count = get(&m.duration_count);
    let _ = writeln!(out, "warden_task_duration_seconds_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "warden_task_duration_seconds_sum {}", get(&m.duration_sum_ms) as f64 / 1000.0);
    let _ = writeln!(out, "warden_task_duration_seconds_count {count}");
    series(&mut out, "warden_approvals_pending", "gauge", "Tool calls waiting for a person.", &[("", pending)]);
    series(&mut out, "warden_plugins_loaded", "gauge", "Plugins loaded.", &[("", snap.plugins.len() as u64)]);
    series(
        &mut out,
        "warden_plugins_invalid",
        "gauge",
        "Plugin files that failed to load.",
        &[("", snap.invalid.len() as u64)],
    );
    series(&mut out, "warden_subagents", "gauge", "Resolved subagents.", &[("", snap.definitions.len() as u64)]);
    let ready = engine.registry().runtime().ready_counters();
    series(
        &mut out,
        "warden_plugin_ready_instances_total",
        "counter",
        "With plugins.ready_instances on: calls that found a ready instance (taken), calls that instantiated their own (missed), ready instances dropped unused (expired).",
        &[
            ("{outcome=\"taken\"}", get(&ready.hits)),
            ("{outcome=\"missed\"}", get(&ready.misses)),
            ("{outcome=\"expired\"}", get(&ready.expired)),
        ],
    );
    // Per plugin (the operator's file stems, escaped): who grows memory, and who is paced.
    let growth: Vec<(String, crate::runtime::growth::GrowthCounts)> =
        snap.plugins.iter().map(|(id, p)| (format!("{{plugin=\"{}\"}}", label_value(id)), p.memory_growth())).collect();
    let grown: Vec<(&str, u64)> = growth.iter().map(|(l, c)| (l.as_str(), c.grown_calls)).collect();
    series(
        &mut out,
        "warden_plugin_grown_calls_total",
        "counter",
        "Calls of each plugin that grew linear memory (each costs the pool page-protection changes; plugins built with the Rust SDK grow only past its arena).",
        &grown,
    );
    let paced: Vec<(&str, u64)> = growth.iter().map(|(l, c)| (l.as_str(), c.paced)).collect();
    series(
        &mut out,
        "warden_plugin_paced_growths_total",
        "counter",
        "Memory growths of each plugin that waited for plugins.budgets.memory_growth_per_second.",
        &paced,
    );
    let total = get(&m.http_requests);
    let c4 = get(&m.http_client_errors);
    let c5 = get(&m.http_server_errors);
    series(
        &mut out,
        "warden_http_responses_total",
        "counter",
        "HTTP responses, by status class.",
        &[("{class=\"2xx_3xx\"}", total.saturating_sub(c4 + c5)), ("{class=\"4xx\"}", c4), ("{class=\"5xx\"}", c5)],
    );
    match engine.replica_id() {
        Some(replica) => with_replica_label(&out, replica),
        None => out,
    }
}

/// `value` as a Prometheus label value. A plugin id is a file name, which may hold any
/// character: control and invisible ones go through the host's one escaper
/// ([`crate::text::escape_control`]: no raw line break, NUL, CR or ESC reaches a scraper),
/// then the exposition format's quoting (backslash and double quote).
fn label_value(value: &str) -> String {
    crate::text::escape_control(value).replace('\\', "\\\\").replace('"', "\\\"")
}

/// Every sample of `text` with a `replica` label, so that one Prometheus scraping several
/// replicas keeps their series apart even behind one address. `replica` is a valid replica
/// id (`[A-Za-z0-9_.-]`): nothing to escape.
fn with_replica_label(text: &str, replica: &str) -> String {
    let mut out = String::with_capacity(text.len() + 32 * text.lines().count());
    for line in text.lines() {
        if line.starts_with('#') {
            out.push_str(line);
        } else if let Some(open) = line.find('{') {
            let _ = write!(out, "{}{{replica=\"{replica}\",{}", &line[..open], &line[open + 1..]);
        } else if let Some((name, value)) = line.split_once(' ') {
            let _ = write!(out, "{name}{{replica=\"{replica}\"}} {value}");
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    /// A plugin file named to break out of its label cannot forge a sample, nor put a raw
    /// control character (CR, NUL, ESC) in front of a scraper.
    #[test]
    fn plugin_ids_are_escaped_in_labels() {
        let id = "a\"} 1\nwarden_tasks_running 999\n\\";
        let line = format!("x{{plugin=\"{}\"}} 0", super::label_value(id));
        assert_eq!(line.lines().count(), 1, "{line}");
        assert_eq!(line, r#"x{plugin="a\"} 1\\nwarden_tasks_running 999\\n\\\\"} 0"#);
        let controls = super::label_value("p\r\0\u{1b}[2J");
        assert!(!controls.chars().any(|c| c.is_control()), "{controls:?}");
        assert_eq!(controls, r"p\\r\\u{0}\\u{1b}[2J");
    }

    #[test]
    fn every_sample_gets_the_replica_label() {
        let text = "# HELP a A.\n# TYPE a gauge\na 1\nb{le=\"0.5\"} 2\n";
        assert_eq!(
            super::with_replica_label(text, "r-1"),
            "# HELP a A.\n# TYPE a gauge\na{replica=\"r-1\"} 1\nb{replica=\"r-1\",le=\"0.5\"} 2\n"
        );
    }
}
