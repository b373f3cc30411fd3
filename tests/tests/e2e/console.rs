//! The operator console (`/ui`) in a real browser: Debian's Chromium driven through its
//! WebDriver server (chromedriver) against a real `warden serve` with principals, a
//! Claude subagent on the scripted model and the real Docker sandbox. Screenshots of
//! every page go to `target/ui-screenshots/` (`WARDEN_UI_SCREENSHOTS`).
//!
//! Without Chromium or chromedriver the test fails, naming what to install: it never
//! skips (`cargo xtask test` installs both).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::common::*;
use crate::operator::toucher_deployment_with;

const ROOT_TOKEN: &str = "tok-console-root";
const ALICE_TOKEN: &str = "tok-console-alice";
const BOB_TOKEN: &str = "tok-console-bob";
const PRINCIPALS: &str = "server:\n  principals:\n    - { name: root, token_env: UI_ROOT_TOKEN, role: admin }\n    - { name: alice, token_env: UI_ALICE_TOKEN, role: user }\n    - { name: bob, token_env: UI_BOB_TOKEN, role: user }\n";
/// Longest wait for anything the page shows (a sandbox starts within it).
const PAGE_WAIT: Duration = Duration::from_secs(90);
/// The narrow layout's width (a small phone).
const PHONE_WIDTH: u32 = 360;

/// A program from `var`, else the first of `names` on PATH; else the test fails loudly.
fn program(var: &str, names: &[&str]) -> PathBuf {
    if let Some(p) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "{var}={} does not exist", p.display());
        return p;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for n in names {
            let p = dir.join(n);
            if p.is_file() {
                return p;
            }
        }
    }
    panic!(
        "{} not found (set {var}): the console tests need Debian's chromium and chromium-driver — \
         `cargo xtask test` installs them, or apt-get install chromium chromium-driver",
        names.join(" / ")
    )
}

/// chromedriver on a free 127.0.0.1 port; killed when dropped.
struct Driver {
    child: Child,
    port: u16,
}

impl Driver {
    fn start() -> Driver {
        let bin = program("WARDEN_CHROMEDRIVER", &["chromedriver"]);
        let port = free_port();
        let child = Command::new(&bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let mut driver = Driver { child, port };
        let until = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = driver.child.try_wait() {
                panic!("chromedriver exited before listening: {status}");
            }
            assert!(Instant::now() < until, "chromedriver did not listen within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        driver
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One of chromedriver's own commands (`/session/{id}/<path>`), POSTed with `body`.
#[derive(Debug)]
struct ChromeCommand {
    path: &'static str,
    body: Value,
}

impl fantoccini::wd::WebDriverCompatibleCommand for ChromeCommand {
    fn endpoint(&self, base: &url::Url, session: Option<&str>) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/{}", session.unwrap_or_default(), self.path))
    }

    fn method_and_body(&self, _url: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(self.body.to_string()))
    }
}

/// A headless Chromium session; its downloads go to `downloads`.
async fn browser(driver: &Driver, downloads: &Path) -> Client {
    let chromium = program("WARDEN_CHROMIUM", &["chromium", "chromium-browser"]);
    let caps = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1280,900", "--no-first-run", "--disable-extensions"],
            "prefs": { "download.default_directory": downloads, "download.prompt_for_download": false }
        },
        "goog:loggingPrefs": { "browser": "ALL" }
    });
    let caps = caps.as_object().unwrap().clone();
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let client = ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a Chromium session through chromedriver");
    // Downloads without a prompt into `downloads` (headless Chromium ignores the prefs).
    client
        .issue_cmd(ChromeCommand {
            path: "goog/cdp/execute",
            body: json!({ "cmd": "Browser.setDownloadBehavior", "params": { "behavior": "allow", "downloadPath": downloads } }),
        })
        .await
        .expect("download behaviour");
    client
}

/// Console messages of level SEVERE since the last call (network errors included).
async fn severe_logs(c: &Client) -> Vec<Value> {
    let logs = c.issue_cmd(ChromeCommand { path: "se/log", body: json!({ "type": "browser" }) }).await.unwrap();
    logs.as_array().cloned().unwrap_or_default().into_iter().filter(|e| e["level"] == "SEVERE").collect()
}

fn screenshots() -> PathBuf {
    let dir = std::env::var_os("WARDEN_UI_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/ui-screenshots"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn shot(c: &Client, name: &str) {
    let png = c.screenshot().await.unwrap();
    std::fs::write(screenshots().join(format!("{name}.png")), png).unwrap();
}

async fn wait_css(c: &Client, css: &str) -> fantoccini::elements::Element {
    c.wait()
        .at_most(PAGE_WAIT)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("`{css}` never appeared: {e}"))
}

/// Waits until `script` (a function body returning a boolean) is true.
async fn wait_js(c: &Client, what: &str, script: &str) {
    let until = Instant::now() + PAGE_WAIT;
    loop {
        if c.execute(script, vec![]).await.unwrap() == Value::Bool(true) {
            return;
        }
        assert!(Instant::now() < until, "{what}: not within {PAGE_WAIT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn sign_in(c: &Client, base: &str, token: &str) {
    c.goto(&format!("{base}/ui/")).await.unwrap();
    let field = wait_css(c, "#token").await;
    wait_js(c, "the sign-in form", "return !document.getElementById('sign-in').hidden;").await;
    field.send_keys(token).await.unwrap();
    c.find(Locator::Css("#sign-in-form button[type=submit]")).await.unwrap().click().await.unwrap();
    wait_js(c, "signed in", "return !document.getElementById('nav').hidden;").await;
}

async fn sign_out(c: &Client) {
    c.find(Locator::Css("#sign-out")).await.unwrap().click().await.unwrap();
    wait_js(c, "signed out", "return !document.getElementById('sign-in').hidden && !sessionStorage.length;").await;
}

fn post_task(port: u16, token: &str, session: &str) -> String {
    let body = json!({ "description": "touch in the console", "prompt": "touch it", "subagent_type": "toucher", "session_id": session, "run_in_background": true });
    let (status, text) =
        http_with(port, "POST", "/v1/tasks", &format!("Authorization: Bearer {token}\r\n"), Some(&body));
    assert_eq!(status, 202, "{text}");
    serde_json::from_str::<Value>(&text).unwrap()["task_id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_chromium_signs_in_streams_approves_downloads_lists_plugins_and_hides_other_users_tasks() {
    let d = toucher_deployment_with(PRINCIPALS);
    let server = tokio::task::block_in_place(|| {
        Server::start_with_env(
            &d,
            &[("UI_ROOT_TOKEN", ROOT_TOKEN), ("UI_ALICE_TOKEN", ALICE_TOKEN), ("UI_BOB_TOKEN", BOB_TOKEN)],
        )
    });
    let port = server.port;
    let base = format!("http://127.0.0.1:{port}");
    let driver = Driver::start();
    let downloads = tempfile::tempdir().unwrap();
    let c = browser(&driver, downloads.path()).await;

    // Sign in as the admin.
    c.goto(&format!("{base}/ui/")).await.unwrap();
    wait_js(&c, "the sign-in form", "return !document.getElementById('sign-in').hidden;").await;
    shot(&c, "sign-in").await;
    sign_in(&c, &base, ROOT_TOKEN).await;
    let who = c.find(Locator::Css("#who")).await.unwrap().text().await.unwrap();
    assert_eq!(who, "root (admin)");
    let stored: Value = c.execute("return document.cookie;", vec![]).await.unwrap();
    assert_eq!(stored, "", "the token never lands in a cookie");

    // Alice's task appears in the live list; its page streams it up to the approval.
    let task = tokio::task::block_in_place(|| post_task(port, ALICE_TOKEN, "console-1"));
    let row = wait_css(&c, &format!("tr[data-task='{task}']")).await;
    wait_js(
        &c,
        "the task's principal",
        &format!("return document.querySelector(\"tr[data-task='{task}']\").textContent.includes('alice');"),
    )
    .await;
    shot(&c, "tasks").await;
    row.find(Locator::Css("a")).await.unwrap().click().await.unwrap();
    let approve = wait_css(&c, "#stream [data-approve]").await;
    wait_js(&c, "the Write call folded with its result", "return !!document.querySelector(\"#stream details[data-tool-call]\") && document.getElementById('stream').textContent.includes('notes.txt');").await;
    wait_js(&c, "the title badge", "return document.title.startsWith('(1)');").await;
    let arguments = c.find(Locator::Css("#stream [data-approval] pre")).await.unwrap().text().await.unwrap();
    assert!(arguments.contains("touch approved.txt"), "{arguments}");
    shot(&c, "task-waiting").await;

    // The Approvals page shows who asks; then approve from the task page.
    c.find(Locator::Css("#nav a[data-page=approvals]")).await.unwrap().click().await.unwrap();
    let card = wait_css(&c, "#approval-list [data-approval]").await;
    let text = card.text().await.unwrap();
    assert!(text.contains("toucher") && text.contains("Bash") && text.contains("alice"), "{text}");
    shot(&c, "approvals").await;
    c.back().await.unwrap();
    let approve_again = wait_css(&c, "#stream [data-approve]").await;
    drop(approve);
    c.find(Locator::Css("#stream select[data-scope]")).await.unwrap().select_by_value("once").await.unwrap();
    approve_again.click().await.unwrap();
    let finish = wait_css(&c, "#finish").await;
    wait_js(&c, "the finish", "return document.getElementById('finish').textContent.includes('completed');").await;
    assert!(finish.text().await.unwrap().contains("Finished."));
    wait_js(
        &c,
        "the decision inline",
        "const r = document.querySelector('#stream [data-resolved]'); return !!r && r.textContent.includes('approve') && r.textContent.includes('root');",
    )
    .await;
    wait_js(
        &c,
        "the badge cleared",
        "return document.title === 'warden' && document.getElementById('approval-count').offsetParent === null;",
    )
    .await;
    shot(&c, "task").await;

    // Its file downloads through the API, with the token as a header.
    let button = wait_css(&c, "[data-download='notes.txt']").await;
    button.click().await.unwrap();
    let file = downloads.path().join("notes.txt");
    let until = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&file).ok().as_deref() != Some("notes of the toucher\n") {
        assert!(Instant::now() < until, "the download never arrived in {}", downloads.path().display());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A plugin dropped into the directory appears without a reload.
    c.find(Locator::Css("#nav a[data-page=plugins]")).await.unwrap().click().await.unwrap();
    wait_css(&c, "tr[data-plugin='claude']").await;
    let plugins = d.dir.path().join("plugins");
    std::fs::copy(test_plugin("echo"), plugins.join(".echo.tmp")).unwrap();
    std::fs::rename(plugins.join(".echo.tmp"), plugins.join("echo.wasm")).unwrap();
    wait_css(&c, "tr[data-plugin='echo']").await;
    wait_js(
        &c,
        "the signature state of the dropped plugin",
        "return document.querySelector(\"tr[data-plugin='echo']\").textContent.includes('unsigned');",
    )
    .await;
    shot(&c, "plugins").await;

    // Sessions and the audit log (admin pages).
    c.find(Locator::Css("#nav a[data-page=sessions]")).await.unwrap().click().await.unwrap();
    wait_css(&c, "tr[data-session='console-1'] [data-end]").await;
    wait_js(
        &c,
        "the session's Docker host",
        "return document.querySelector(\"tr[data-session='console-1']\").textContent.includes('docker');",
    )
    .await;
    shot(&c, "sessions").await;
    // Pause stops its container and says so; Resume starts it again.
    c.find(Locator::Css("[data-pause='console-1']")).await.unwrap().click().await.unwrap();
    wait_js(
        &c,
        "the session paused",
        "const r = document.querySelector(\"tr[data-session='console-1']\"); return r.textContent.includes('paused') && r.querySelector('[data-pause]').textContent === 'Resume';",
    )
    .await;
    c.find(Locator::Css("[data-pause='console-1']")).await.unwrap().click().await.unwrap();
    wait_js(
        &c,
        "the session running again",
        "const r = document.querySelector(\"tr[data-session='console-1']\"); return r.textContent.includes('running') && r.querySelector('[data-pause]').textContent === 'Pause';",
    )
    .await;
    c.find(Locator::Css("[data-end='console-1']")).await.unwrap().click().await.unwrap();
    wait_js(&c, "the ended session gone", "return !document.querySelector(\"tr[data-session='console-1']\");").await;
    c.find(Locator::Css("#nav a[data-page=audit]")).await.unwrap().click().await.unwrap();
    wait_js(
        &c,
        "the approval in the audit log",
        "return document.querySelector('main table').textContent.includes('user:root');",
    )
    .await;
    c.find(Locator::Css("#audit-decision")).await.unwrap().select_by_value("approve").await.unwrap();
    shot(&c, "audit").await;

    // A phone: no sideways scrolling on the task list.
    c.set_window_size(PHONE_WIDTH, 780).await.unwrap();
    c.find(Locator::Css("#nav a[data-page=tasks]")).await.unwrap().click().await.unwrap();
    wait_css(&c, &format!("tr[data-task='{task}']")).await;
    wait_js(
        &c,
        "no horizontal overflow at 360 px",
        "return document.documentElement.scrollWidth <= window.innerWidth;",
    )
    .await;
    shot(&c, "tasks-360px").await;
    c.set_window_size(1280, 900).await.unwrap();

    // Keyboard: the navigation is reachable with Tab from the top of the page.
    let reached: Value = c
        .execute(
            "const links = Array.from(document.querySelectorAll('#nav a')); \
             return links.every(a => a.tabIndex >= 0 && !a.hidden);",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(reached, Value::Bool(true), "every page is a focusable link");
    let errors = severe_logs(&c).await;
    assert!(errors.is_empty(), "console errors: {errors:#?}");

    // Bob (a user) sees neither Alice's task in the list nor its page.
    sign_out(&c).await;
    sign_in(&c, &base, BOB_TOKEN).await;
    let own = tokio::task::block_in_place(|| post_task(port, BOB_TOKEN, "console-bob"));
    wait_css(&c, &format!("tr[data-task='{own}']")).await;
    let listed: Value =
        c.execute(&format!("return !!document.querySelector(\"tr[data-task='{task}']\");"), vec![]).await.unwrap();
    assert_eq!(listed, Value::Bool(false), "bob sees alice's task");
    let admin_links: Value = c
        .execute("return Array.from(document.querySelectorAll('#nav [data-admin]')).every(a => a.hidden);", vec![])
        .await
        .unwrap();
    assert_eq!(admin_links, Value::Bool(true), "admin pages offered to a user");
    c.goto(&format!("{base}/ui/#/tasks/{task}")).await.unwrap();
    wait_js(
        &c,
        "alice's task refused",
        "return document.querySelector('main').textContent.includes('(or not yours)');",
    )
    .await;
    shot(&c, "other-users-task").await;
    let stream: Value = c.execute("return document.getElementById('stream').textContent;", vec![]).await.unwrap();
    assert_eq!(stream, "", "bob read alice's events");

    c.close().await.unwrap();
    drop(server);
    let log = std::fs::read_to_string(d.dir.path().join("serve.log")).unwrap();
    for token in [ROOT_TOKEN, ALICE_TOKEN, BOB_TOKEN] {
        assert!(!log.contains(token), "a token reached the log");
    }
}
