//! `warden plugin push | pull` against a real OCI registry: Debian's `docker-registry`
//! (Distribution 2.8; `WARDEN_REGISTRY_BIN`, installed by `cargo xtask test`), started on a
//! free 127.0.0.1 port with a temporary storage directory, over plain HTTP (`--insecure`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{Deployment, Server, bin, free_port, http, http_with, json_of, python, stdout, test_plugin};

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// Default location of Debian's registry binary.
const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// A registry process with its own storage; killed when dropped.
pub(crate) struct Registry {
    child: Child,
    port: u16,
    storage: tempfile::TempDir,
}

impl Registry {
    pub(crate) fn start() -> Registry {
        Self::start_with(None)
    }

    /// A registry that requires HTTP Basic `user:password` (an htpasswd file, bcrypt).
    fn start_with(user: Option<(&str, &str)>) -> Registry {
        let bin = std::env::var_os("WARDEN_REGISTRY_BIN").map(PathBuf::from).unwrap_or_else(|| REGISTRY_BIN.into());
        assert!(
            bin.is_file(),
            "OCI registry missing at {} — run `cargo xtask test` (apt-get install docker-registry)",
            bin.display()
        );
        let storage = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = storage.path().join("config.yml");
        let mut yaml = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            storage.path().join("data").display()
        );
        if let Some((name, password)) = user {
            // Distribution reads bcrypt only; Python's crypt module makes it.
            let hash = Command::new(python())
                .args([
                    "-W",
                    "ignore",
                    "-c",
                    "import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)))",
                    password,
                ])
                .output()
                .unwrap();
            assert!(hash.status.success(), "{hash:?}");
            let htpasswd = storage.path().join("htpasswd");
            std::fs::write(&htpasswd, format!("{name}:{}", stdout(&hash).trim())).unwrap();
            yaml.push_str(&format!("auth:\n  htpasswd:\n    realm: warden-test\n    path: {}\n", htpasswd.display()));
        }
        std::fs::write(&config, yaml).unwrap();
        let log = std::fs::File::create(storage.path().join("registry.log")).unwrap();
        let child =
            Command::new(&bin).arg("serve").arg(&config).stdout(log.try_clone().unwrap()).stderr(log).spawn().unwrap();
        let mut registry = Registry { child, port, storage };
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = registry.child.try_wait() {
                panic!("the registry exited: {status}\n{}", registry.log());
            }
            // 200, or 401 when it asks for credentials: it is serving.
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                && matches!(http(port, "GET", "/v2/", None).0, 200 | 401)
            {
                return registry;
            }
            assert!(Instant::now() < until, "the registry did not answer /v2/ within 30 s\n{}", registry.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.storage.path().join("registry.log")).unwrap_or_default()
    }

    pub(crate) fn url(&self, repo_tag: &str) -> String {
        format!("oci://127.0.0.1:{}/{repo_tag}", self.port)
    }

    /// Where the filesystem driver keeps the blob with this digest.
    fn blob(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.storage.path().join(format!("data/docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2]))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `warden ARGS` with no configuration (the publisher's side) and no registry credentials.
fn warden(cwd: &Path, args: &[&str]) -> Output {
    warden_env(cwd, args, &[])
}

fn warden_env(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(bin())
        .current_dir(cwd)
        .args(args)
        .env_remove("WARDEN_REGISTRY_USERNAME")
        .env_remove("WARDEN_REGISTRY_PASSWORD")
        .env_remove("WARDEN_REGISTRY_HOST")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A publisher's directory with `echo.wasm`, a key pair NAME.key/NAME.pub and the
/// signature; returns the public key.
fn signed_echo(dir: &Path, key: &str) -> String {
    std::fs::copy(test_plugin("echo"), dir.join("echo.wasm")).unwrap();
    let o = warden(dir, &["plugin", "keygen", "--out", key]);
    assert!(o.status.success(), "{o:?}");
    let o = warden(dir, &["plugin", "sign", "echo.wasm", "--key", &format!("{key}.key")]);
    assert!(o.status.success(), "{o:?}");
    std::fs::read_to_string(dir.join(format!("{key}.pub"))).unwrap().trim().to_owned()
}

fn push(dir: &Path, file: &str, target: &str) -> Output {
    warden(dir, &["plugin", "push", file, target, "--insecure"])
}

/// The names in a plugin directory, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// A manifest as the registry serves it to a client that accepts OCI manifests.
fn manifest(registry: &Registry, repo: &str, tag: &str) -> serde_json::Value {
    let accept = "Accept: application/vnd.oci.image.manifest.v1+json\r\n";
    let (status, text) = http_with(registry.port, "GET", &format!("/v2/{repo}/manifests/{tag}"), accept, None);
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

#[test]
fn a_signed_plugin_is_pushed_in_the_wasm_layout_pulled_into_a_running_server_and_answers_a_task() {
    let registry = Registry::start();
    let publisher = tempfile::tempdir().unwrap();
    let public = signed_echo(publisher.path(), "release");
    let target = registry.url("warden/echo:1.0");
    let o = push(publisher.path(), "echo.wasm", &target);
    assert!(o.status.success(), "{o:?}");
    assert!(stderr(&o).contains(&public), "{o:?}");
    let pushed = stdout(&o).trim().to_owned();
    assert!(pushed.starts_with(&format!("{target}@sha256:")), "{pushed}");

    // The layout `wkg oci push` writes: an OCI manifest, the wasm config, one application/wasm layer.
    let manifest = manifest(&registry, "warden/echo", "1.0");
    assert_eq!(manifest["mediaType"], "application/vnd.oci.image.manifest.v1+json", "{manifest}");
    assert_eq!(manifest["config"]["mediaType"], "application/vnd.wasm.config.v0+json", "{manifest}");
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest}");
    assert_eq!(layers[0]["mediaType"], "application/wasm");
    assert_eq!(layers[0]["annotations"]["org.opencontainers.image.title"], "echo.wasm");
    let sig = std::fs::read_to_string(publisher.path().join("echo.wasm.sig")).unwrap();
    assert_eq!(manifest["annotations"]["dev.warden.plugin.signature"], sig.trim());
    let config_digest = manifest["config"]["digest"].as_str().unwrap();
    let (_, config) = json_of(registry.port, "GET", &format!("/v2/warden/echo/blobs/{config_digest}"), None);
    assert_eq!((config["architecture"].as_str(), config["os"].as_str()), (Some("wasm"), Some("wasip2")), "{config}");
    assert_eq!(config["layerDigests"], json!([layers[0]["digest"]]));

    // A deployment that requires signatures by this key, serving with an empty plugin directory.
    let d = Deployment::new(&format!(
        "  require_signature: true\n  trust: [\"{public}\"]\n  grants:\n    echo: {{ log: true, events: true, state: true }}\n\
         subagents:\n  agent_dirs: []\n  references:\n    - {{ uri: \"echo://greeter\", kind: ECHO }}\nstore:\n  path: ./state/tasks.db\n"
    ));
    let server = Server::start(&d);
    let plugins = d.dir.path().join("plugins");
    assert!(listing(&plugins).is_empty());
    let o = d.warden(&["plugin", "pull", &target, "--insecure"]);
    assert!(o.status.success(), "{o:?}");
    assert!(stderr(&o).contains(&format!("signature verified: {public}")), "{o:?}");
    assert_eq!(Path::new(stdout(&o).trim()).canonicalize().unwrap(), plugins.join("echo.wasm").canonicalize().unwrap());
    // The component and its signature, whole, and no temporary file left.
    assert_eq!(listing(&plugins), ["echo.wasm", "echo.wasm.sig"]);
    assert_eq!(std::fs::read(plugins.join("echo.wasm")).unwrap(), std::fs::read(test_plugin("echo")).unwrap());

    // The running server picks it up and answers a task through it.
    let task = json!({ "description": "e2e", "prompt": "from the registry", "subagent_type": "greeter" });
    let until = Instant::now() + Duration::from_secs(60);
    let done = loop {
        let (status, r) = json_of(server.port, "POST", "/v1/tasks", Some(&task));
        if status == 200 && r["status"] == "completed" {
            break r;
        }
        assert!(Instant::now() < until, "no task through the pulled plugin: {status} {r}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(done["output"].as_str().unwrap().contains("from the registry"), "{done}");
    // The plugin list names the trusted key its signature verified against.
    let (status, list) = json_of(server.port, "GET", "/v1/plugins", None);
    assert_eq!(status, 200, "{list}");
    let echo = list["plugins"].as_array().unwrap().iter().find(|p| p["id"] == "echo").cloned().unwrap();
    assert_eq!(echo["signature"], json!({ "state": "signed", "key": public }), "{echo}");

    // Pulling by digest works as well (the same version again: no rollback) ...
    let o = d.warden(&["plugin", "pull", &pushed, "--insecure"]);
    assert!(o.status.success(), "{o:?}");
    assert!(stderr(&o).contains("(plugin echo version 0.1.0)") && stderr(&o).contains("replaced"), "{o:?}");
    let o = d.warden(&["plugin", "inspect", plugins.join("echo.wasm").to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    assert!(stdout(&o).contains("valid:    yes"), "{o:?}");
    // ... but a signed artifact installs only as the id its signature names.
    let o = d.warden(&["plugin", "pull", &pushed, "--insecure", "--as", "echo2"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).contains("signed for plugin id echo, not echo2"), "{o:?}");
    assert_eq!(listing(&plugins), ["echo.wasm", "echo.wasm.sig"]);
}

/// `dir/ID.wasm` (a copy of the test plugin `plugin`) signed for `ID` with `key.key` (made
/// when missing); returns the public key.
fn signed_as(dir: &Path, plugin: &str, id: &str, key: &str) -> String {
    std::fs::copy(test_plugin(plugin), dir.join(format!("{id}.wasm"))).unwrap();
    if !dir.join(format!("{key}.key")).exists() {
        let o = warden(dir, &["plugin", "keygen", "--out", key]);
        assert!(o.status.success(), "{o:?}");
    }
    let o = warden(dir, &["plugin", "sign", &format!("{id}.wasm"), "--key", &format!("{key}.key")]);
    assert!(o.status.success(), "{o:?}");
    std::fs::read_to_string(dir.join(format!("{key}.pub"))).unwrap().trim().to_owned()
}

/// Signatures and `plugins.trust` covered keys, not ids: any trusted publisher's artifact
/// could be installed as (and replace) another publisher's plugin and take its grants,
/// secrets, state and priority, and any older signed build could be pulled over a newer one.
#[test]
fn regression_an_artifact_cannot_take_over_another_publishers_plugin_or_roll_it_back() {
    let registry = Registry::start();
    // Vendor A publishes `weather`, and also a hostile `github`; vendor B publishes `github`
    // 0.2.0 and once published 0.1.0; the last one is unsigned.
    let (a, b1, b2, unsigned) = (tempdir(), tempdir(), tempdir(), tempdir());
    let vendor_a = signed_as(a.path(), "echo", "github", "a");
    signed_as(a.path(), "echo", "weather", "a");
    let vendor_b = signed_as(b2.path(), "echo-v2", "github", "b");
    std::fs::copy(b2.path().join("b.key"), b1.path().join("b.key")).unwrap();
    std::fs::copy(b2.path().join("b.pub"), b1.path().join("b.pub")).unwrap();
    signed_as(b1.path(), "echo", "github", "b");
    std::fs::copy(test_plugin("echo"), unsigned.path().join("github.wasm")).unwrap();
    for (dir, file, repo) in [
        (a.path(), "github.wasm", "a/github:1"),
        (a.path(), "weather.wasm", "a/weather:1"),
        (b1.path(), "github.wasm", "b/github:1"),
        (b2.path(), "github.wasm", "b/github:2"),
        (unsigned.path(), "github.wasm", "b/github:3"),
    ] {
        let o = push(dir, file, &registry.url(repo));
        assert!(o.status.success(), "{repo}: {o:?}");
    }
    // Each key is trusted for its publisher's ids only.
    let d = Deployment::new(&format!(
        "  trust:\n    - {{ key: {vendor_a}, ids: [weather] }}\n    - {{ key: {vendor_b}, ids: [github] }}\n"
    ));
    let plugins = d.dir.path().join("plugins");
    let pull = |repo: &str, extra: &[&str]| {
        let url = registry.url(repo);
        let mut args = vec!["plugin", "pull", url.as_str(), "--insecure"];
        args.extend_from_slice(extra);
        d.warden(&args)
    };
    let refused = |o: Output, reason: &str| {
        assert_eq!(o.status.code(), Some(2), "expected {reason:?}: {o:?}");
        assert!(stderr(&o).contains(reason), "expected {reason:?} in {o:?}");
    };
    let installed = || std::fs::read(plugins.join("github.wasm")).unwrap();

    // B's github 0.2.0 installs.
    let o = pull("b/github:2", &[]);
    assert!(o.status.success(), "{o:?}");
    assert!(stderr(&o).contains("(plugin github version 0.2.0)"), "{o:?}");
    assert_eq!(installed(), std::fs::read(test_plugin("echo-v2")).unwrap());
    // A's key signs `github`, but it is trusted for `weather` only: refused, nothing replaced.
    refused(pull("a/github:1", &[]), "allows only for plugin ids weather, not for github");
    // A's weather artifact, installed as github, is refused for the same reason.
    refused(pull("a/weather:1", &["--as", "github"]), "allows only for plugin ids weather, not for github");
    // B's own older build is a rollback, and so is an unsigned artifact over a signed plugin.
    refused(pull("b/github:1", &[]), "version 0.1.0 is older than the installed version 0.2.0");
    refused(pull("b/github:3", &[]), "the installed plugin is signed (version 0.2.0) and this one is not");
    assert_eq!(installed(), std::fs::read(test_plugin("echo-v2")).unwrap(), "nothing replaced github");
    assert_eq!(listing(&plugins), ["github.wasm", "github.wasm.sig"]);
    // A deliberate rollback says so.
    let o = pull("b/github:1", &["--allow-downgrade"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(installed(), std::fs::read(test_plugin("echo")).unwrap());
    // And A's weather installs as weather.
    let o = pull("a/weather:1", &[]);
    assert!(o.status.success(), "{o:?}");
}

#[test]
fn a_tampered_blob_an_untrusted_or_missing_signature_and_a_wrong_pin_are_refused_and_nothing_is_installed() {
    let registry = Registry::start();
    let publisher = tempfile::tempdir().unwrap();
    let trusted = signed_echo(publisher.path(), "release");
    let other = tempfile::tempdir().unwrap();
    let untrusted = signed_echo(other.path(), "stranger");
    assert_ne!(trusted, untrusted);
    let unsigned = tempfile::tempdir().unwrap();
    std::fs::copy(test_plugin("echo"), unsigned.path().join("echo.wasm")).unwrap();

    for (dir, repo) in [
        (publisher.path(), "good"),
        (other.path(), "stranger"),
        (unsigned.path(), "unsigned"),
        (publisher.path(), "tampered"),
    ] {
        let o = push(dir, "echo.wasm", &registry.url(&format!("{repo}/echo:1")));
        assert!(o.status.success(), "{repo}: {o:?}");
    }
    let d = Deployment::new(&format!("  require_signature: true\n  trust: [\"{trusted}\"]\n"));
    let plugins = d.dir.path().join("plugins");
    let refused = |repo: &str, reason: &str| {
        let o = d.warden(&["plugin", "pull", &registry.url(&format!("{repo}/echo:1")), "--insecure"]);
        assert_eq!(o.status.code(), Some(2), "{repo}: {o:?}");
        assert!(stderr(&o).contains(reason), "{repo}: expected {reason:?} in {o:?}");
        assert!(listing(&plugins).is_empty(), "{repo}: installed {:?}", listing(&plugins));
    };

    // The layer's bytes changed in the registry's storage: its digest no longer matches.
    // (The same blob backs every repository, so the other cases come first.)
    refused("stranger", "which is not in plugins.trust");
    refused("unsigned", "unsigned: no signature annotation dev.warden.plugin.signature");
    let manifest = manifest(&registry, "tampered/echo", "1");
    let blob = registry.blob(manifest["layers"][0]["digest"].as_str().unwrap());
    let mut bytes = std::fs::read(&blob).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&blob, bytes).unwrap();
    refused("tampered", "does not match its digest");

    // A pin names the expected and the actual hash (the blob restored first).
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[middle] ^= 0x01;
    std::fs::write(&blob, bytes).unwrap();
    let pinned = Deployment::new(&format!("  trust: [\"{trusted}\"]\n  pins:\n    echo: \"{}\"\n", "0".repeat(64)));
    let o = pinned.warden(&["plugin", "pull", &registry.url("good/echo:1"), "--insecure"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).contains("plugins.pins.echo"), "{o:?}");
    assert!(listing(&pinned.dir.path().join("plugins")).is_empty());
    // The good one still installs.
    let o = d.warden(&["plugin", "pull", &registry.url("good/echo:1"), "--insecure"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(listing(&plugins), ["echo.wasm", "echo.wasm.sig"]);
}

#[test]
fn push_refuses_a_signature_of_other_bytes_a_core_module_and_plain_http_to_a_remote_registry() {
    let registry = Registry::start();
    let publisher = tempfile::tempdir().unwrap();
    signed_echo(publisher.path(), "release");
    // The signature of echo.wasm beside a different component.
    std::fs::copy(test_plugin("echo-v2"), publisher.path().join("echo-v2.wasm")).unwrap();
    std::fs::copy(publisher.path().join("echo.wasm.sig"), publisher.path().join("echo-v2.wasm.sig")).unwrap();
    let o = push(publisher.path(), "echo-v2.wasm", &registry.url("mixed/echo:1"));
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).contains("does not match the file"), "{o:?}");
    // A core module is not a component.
    std::fs::write(publisher.path().join("core.wasm"), b"\0asm\x01\x00\x00\x00").unwrap();
    let o = push(publisher.path(), "core.wasm", &registry.url("core/x:1"));
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).contains("not a WebAssembly component"), "{o:?}");
    // Plain HTTP only to this machine; nothing was pushed by the refused calls.
    let o = push(publisher.path(), "echo.wasm", "oci://registry.example.com/echo:1");
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).contains("only for a registry on this machine"), "{o:?}");
    let (status, catalog) = json_of(registry.port, "GET", "/v2/_catalog", None);
    assert_eq!((status, &catalog["repositories"]), (200, &json!([])), "{catalog}");
}

#[test]
fn credentials_come_from_the_environment_and_are_needed_where_the_registry_asks() {
    let registry = Registry::start_with(Some(("alice", "s3cret-pw")));
    let publisher = tempfile::tempdir().unwrap();
    std::fs::copy(test_plugin("echo"), publisher.path().join("echo.wasm")).unwrap();
    let target = registry.url("private/echo:1");
    let push = |env: &[(&str, &str)]| {
        warden_env(publisher.path(), &["plugin", "push", "echo.wasm", &target, "--insecure"], env)
    };
    let host = format!("127.0.0.1:{}", registry.port);
    let alice = [
        ("WARDEN_REGISTRY_USERNAME", "alice"),
        ("WARDEN_REGISTRY_PASSWORD", "s3cret-pw"),
        ("WARDEN_REGISTRY_HOST", host.as_str()),
    ];
    // Credentials name the one registry they are for ...
    let o = push(&alice[..2]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).contains("set WARDEN_REGISTRY_HOST"), "{o:?}");
    // ... and any other registry gets none of them: here the one asking is not the one named.
    let o = push(&[alice[0], alice[1], ("WARDEN_REGISTRY_HOST", "registry.example.com")]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).to_ascii_lowercase().contains("unauthorized"), "{o:?}");
    let o = push(&[]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).to_ascii_lowercase().contains("unauthorized"), "{o:?}");
    let o = push(&[("WARDEN_REGISTRY_USERNAME", "alice")]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).contains("set both WARDEN_REGISTRY_USERNAME and WARDEN_REGISTRY_PASSWORD"), "{o:?}");
    let o = push(&[
        ("WARDEN_REGISTRY_USERNAME", "alice"),
        ("WARDEN_REGISTRY_PASSWORD", "wrong"),
        ("WARDEN_REGISTRY_HOST", host.as_str()),
    ]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let o = push(&alice);
    assert!(o.status.success(), "{o:?}");
    // The password appears in no output.
    assert!(!stderr(&o).contains("s3cret-pw") && !stdout(&o).contains("s3cret-pw"), "{o:?}");

    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("warden.yaml"), "plugins:\n  dir: ./plugins\n").unwrap();
    let pull = |env: &[(&str, &str)]| {
        warden_env(d.path(), &["--config", "warden.yaml", "plugin", "pull", &target, "--insecure"], env)
    };
    let o = pull(&[]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(!d.path().join("plugins/echo.wasm").exists());
    let o = pull(&alice);
    assert!(o.status.success(), "{o:?}");
    assert!(stderr(&o).contains("unsigned"), "{o:?}");
    assert_eq!(std::fs::read(d.path().join("plugins/echo.wasm")).unwrap(), std::fs::read(test_plugin("echo")).unwrap());
}

/// Regression: the artifact's own title chose the plugin id, so a trusted publisher's
/// artifact could replace another plugin (and get its grants).
#[test]
fn an_artifact_cannot_choose_which_plugin_it_replaces() {
    let registry = Registry::start_with(None);
    let publisher = tempfile::tempdir().unwrap();
    std::fs::copy(test_plugin("echo"), publisher.path().join("echo.wasm")).unwrap();
    let target = registry.url("vendor/billing:1");
    let o = warden(publisher.path(), &["plugin", "push", "echo.wasm", &target, "--insecure"]);
    assert!(o.status.success(), "{o:?}");
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("warden.yaml"), "plugins:\n  dir: ./plugins\n").unwrap();
    let pull = |extra: &[&str]| {
        let mut args = vec!["--config", "warden.yaml", "plugin", "pull", &target, "--insecure"];
        args.extend_from_slice(extra);
        warden(d.path(), &args)
    };
    let o = pull(&[]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).contains("--as"), "{o:?}");
    assert!(!d.path().join("plugins/echo.wasm").exists() && !d.path().join("plugins/billing.wasm").exists());
    let o = pull(&["--as", "billing"]);
    assert!(o.status.success(), "{o:?}");
    let installed = d.path().join("plugins/billing.wasm");
    assert_eq!(std::fs::read(&installed).unwrap(), std::fs::read(test_plugin("echo")).unwrap());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&installed).unwrap().permissions().mode() & 0o777, 0o644);
}
