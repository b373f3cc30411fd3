//! `warden plugin test`: one task through one plugin file, for plugin authors — no
//! configuration file needed, no task store, no Docker, no compile cache, nothing written.
//!
//! Grants come from the command line and nothing is granted by default, exactly as in
//! `plugins.grants`. A `model` grant is answered by the scripted model of
//! `--model-script` (the offline stand-in for an LLM); `tools` has no sandbox here and
//! every tool call returns an error the plugin can handle. This module must never write
//! a file or reach anything the given grants do not name. With `--replay`, a durable
//! task's journal answers the plugin's import calls instead ([`crate::journal`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use serde::Serialize;

use super::{EXIT_USAGE, LOCAL_USER, esc, esc_lines, print_event};
use crate::config::{Config, GrantConfig};
use crate::plugin::{SubagentDefinition, SubagentReference, TaskCall, TaskContext};

/// Capacity of the event channel between the task and the printer.
const EVENT_CHANNEL_CAPACITY: usize = 1024;

/// What `warden plugin test` was asked to do.
#[derive(clap::Args, Debug)]
pub struct TestArgs {
    /// The plugin component (`.wasm`).
    pub file: PathBuf,
    /// The reference's URI, as in `subagents.references`.
    #[arg(long = "ref", value_name = "URI")]
    pub reference: String,
    /// The reference's kind (default: the plugin's first kind).
    #[arg(long)]
    pub kind: Option<String>,
    /// Reference metadata, `key=value` (repeatable).
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    pub meta: Vec<String>,
    /// Capabilities to grant: log, events, state, model, tools, resources (repeatable or
    /// comma-separated). Nothing is granted by default.
    #[arg(long = "grant", value_name = "CAPABILITY")]
    pub grant: Vec<String>,
    /// An HTTP allow-list pattern to grant, e.g. `http://127.0.0.1:*` (repeatable).
    #[arg(long = "http", value_name = "PATTERN")]
    pub http: Vec<String>,
    /// The task's prompt.
    #[arg(long, required_unless_present = "replay")]
    pub prompt: Option<String>,
    /// A durable task's journal (what `warden task journal ID` prints, saved to a file):
    /// the plugin is called with the task's call, ids and session, and every import call is
    /// answered from the journal — no model, network or sandbox — so a task seen in
    /// production runs again exactly. Past the journal's end, imports run as the other
    /// flags allow; a call that differs from the journal ends the run, naming it.
    #[arg(long, value_name = "JOURNAL", conflicts_with = "prompt")]
    pub replay: Option<PathBuf>,
    /// A scripted-model file answering the plugin's model calls (needs `--grant model`).
    #[arg(long, value_name = "FILE")]
    pub model_script: Option<PathBuf>,
    /// Print one JSON object {definition, events, status, output, error}.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report {
    definition: Option<SubagentDefinition>,
    events: Vec<serde_json::Value>,
    status: &'static str,
    output: Option<String>,
    error: Option<String>,
}

fn grants(args: &TestArgs) -> anyhow::Result<GrantConfig> {
    let mut g = GrantConfig { http: args.http.clone(), ..GrantConfig::default() };
    for name in args.grant.iter().flat_map(|g| g.split(',')).map(str::trim).filter(|n| !n.is_empty()) {
        match name {
            "log" => g.log = true,
            "events" => g.events = true,
            "state" => g.state = true,
            "model" => g.model = true,
            "tools" => g.tools = true,
            "resources" => g.resources = true,
            other => anyhow::bail!(
                "--grant {other:?}: expected one of log, events, state, model, tools, resources (HTTP: --http PATTERN)"
            ),
        }
    }
    Ok(g)
}

fn metadata(args: &TestArgs) -> anyhow::Result<BTreeMap<String, String>> {
    args.meta
        .iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => anyhow::bail!("--meta {kv:?}: expected KEY=VALUE"),
        })
        .collect()
}

/// The journal file `path` (`{"task_id", "entries": [{"seq", "entry"}]}`, as
/// `warden task journal` prints it): the task id and the journal. A journal recorded with
/// another build than `plugin` (the file's bytes) is replayed all the same, with a warning:
/// an author replaying a fix wants to see where it departs from what happened.
fn read_journal(path: &std::path::Path, plugin: &[u8]) -> anyhow::Result<(String, crate::journal::Recorded)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("--replay {}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| {
        format!("--replay {}: not JSON (expected what `warden task journal ID` prints)", path.display())
    })?;
    let task_id = v["task_id"].as_str().with_context(|| format!("--replay {}: no `task_id`", path.display()))?;
    let rows = v["entries"]
        .as_array()
        .with_context(|| format!("--replay {}: no `entries` list", path.display()))?
        .iter()
        .map(|e| Ok((e["seq"].as_u64().context("an entry without a `seq`")?, e["entry"].clone())))
        .collect::<anyhow::Result<Vec<_>>>()
        .with_context(|| format!("--replay {}", path.display()))?;
    let recorded = crate::journal::Recorded::from_rows(task_id, rows)
        .map_err(|e| anyhow::anyhow!("--replay {}: {e}", path.display()))?;
    let Some(header) = &recorded.header else {
        anyhow::bail!("--replay {}: the journal has no header (the task was not durable)", path.display());
    };
    let sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(plugin));
    if header.plugin.sha256 != sha256 {
        eprintln!(
            "warning: the journal was recorded with {} {} (sha256 {}); this file's sha256 is {sha256}: the replay stops \
             at the first call that differs",
            esc(&header.plugin.id),
            esc(&header.plugin.version),
            esc(&header.plugin.sha256)
        );
    }
    Ok((task_id.to_owned(), recorded))
}

pub async fn run(config: Config, args: TestArgs) -> anyhow::Result<ExitCode> {
    let grant = grants(&args)?;
    let metadata = metadata(&args)?;
    let bytes = crate::registry::read_plugin_file(&args.file, config.plugins.max_plugin_size)
        .await
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.file.display()))?;
    let mut services = crate::services::HostServices::new(vec![]).with_budgets(config.plugins.budgets);
    if let Some(script) = &args.model_script {
        let script = std::path::absolute(script).with_context(|| format!("--model-script {}", script.display()))?;
        let yaml = format!(
            "default: test/scripted\nproviders:\n  test: {{ type: scripted, script: {} }}\n",
            serde_json::to_string(&script.display().to_string())?
        );
        let models: warden_models::ModelsConfig = serde_yaml::from_str(&yaml).context("the scripted model")?;
        let router = warden_models::ModelRouter::from_config(&models, std::path::Path::new("."))
            .map_err(|e| anyhow::anyhow!("--model-script {}: {e}", script.display()))?;
        services = services.with_models(Ok(Arc::new(router)));
    }
    let replay = match &args.replay {
        Some(path) => Some(read_journal(path, &bytes)?),
        None => None,
    };
    let runtime = super::one_off_runtime(&config, services)?;
    let id = crate::registry::plugin_id(&args.file).unwrap_or_else(|| "tested".into());
    let plugin = runtime
        .load(&id, args.file.clone(), &bytes, config.limits_for(&id), Some(&grant))
        .await
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.file.display()))?;
    let kind = args.kind.clone().or_else(|| plugin.info.kinds.first().cloned()).unwrap_or_default();
    let reference = SubagentReference { uri: args.reference.clone(), kind, metadata };
    let mut report = Report { definition: None, events: vec![], status: "failed", output: None, error: None };
    let resolved = match runtime.can_resolve(&plugin, &reference).await {
        Ok(true) => runtime.resolve(&plugin, &reference).await.map_err(|e| e.to_string()),
        Ok(false) => Err(format!("the plugin does not resolve {} (kind {})", reference.uri, reference.kind)),
        Err(e) => Err(e.to_string()),
    };
    match resolved {
        Err(e) => report.error = Some(format!("resolve: {e}")),
        Ok(definition) => {
            let (tx, mut rx) = tokio::sync::mpsc::channel(EVENT_CHANNEL_CAPACITY);
            let print = !args.json;
            let subagent = definition.name.clone();
            let printer = tokio::spawn(async move {
                let mut events = vec![];
                while let Some(ev) = rx.recv().await {
                    let ev = crate::event::TaskEvent::into_json(ev, &subagent);
                    if print {
                        print_event(&ev);
                    }
                    events.push(ev);
                }
                events
            });
            let (call, task, journal) = match &replay {
                Some((task_id, recorded)) => {
                    let header = recorded.header.as_ref().expect("checked when read");
                    let task = TaskContext {
                        task_id: task_id.clone(),
                        session_id: header.session_id.clone(),
                        user_id: header.user_id.clone(),
                    };
                    // Offline, nothing is written: the journal's writes go to a store in memory.
                    let store = crate::store::Store::in_memory().map_err(|e| anyhow::anyhow!("{e}"))?;
                    let journal =
                        crate::journal::TaskJournal::replaying(task_id, store, u64::MAX, recorded.clone()).restarted();
                    (header.call.clone(), task, Some(Arc::new(journal)))
                }
                None => {
                    let call = TaskCall {
                        description: "plugin test".into(),
                        prompt: args.prompt.clone().unwrap_or_default(),
                        subagent_type: definition.name.clone(),
                        ..TaskCall::default()
                    };
                    let task = TaskContext {
                        task_id: crate::task::new_task_id(),
                        session_id: "plugin-test".into(),
                        user_id: LOCAL_USER.into(),
                    };
                    (call, task, None)
                }
            };
            let scope = crate::scope::TaskScope { events: Some(tx), journal, ..Default::default() };
            let result = runtime.execute(&plugin, task, &call, &definition, scope).await;
            report.events = printer.await.unwrap_or_default();
            report.definition = Some(definition);
            match result {
                Ok(out) => {
                    report.status = "completed";
                    report.output = Some(out);
                }
                Err(e) => report.error = Some(e.to_string()),
            }
        }
    }
    if args.json {
        out!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        if let Some(d) = &report.definition {
            eprintln!("resolved: {} ({}) — {}", esc(&d.name), esc(&d.kind), esc(&d.description));
        }
        if let Some(out) = &report.output {
            out!("{}", esc_lines(out));
        }
        if let Some(e) = &report.error {
            eprintln!("error: {}", esc(e));
        }
    }
    Ok(if report.status == "completed" { ExitCode::SUCCESS } else { ExitCode::from(EXIT_USAGE) })
}
