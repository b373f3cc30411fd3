//! The layering check: inside every crate of the repository, the top-level modules form a
//! graph without cycles, and no module reaches up into the crate root (`lib.rs` only
//! declares modules and composes them; a constant other modules import lives in a module).
//!
//! Edges are the `crate::<module>` paths written in a module's files (code, not comments),
//! including `use crate::{a, b::c}` groups. It is a
//! textual check on purpose: it needs no compiler, runs in milliseconds, and its report
//! names the file and line of every edge on a cycle so the fix is a file name away.
//!
//! Run first by `cargo xtask test` (and as a unit test of xtask).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The pseudo-module for items declared in the crate root (`lib.rs` / `main.rs`).
const ROOT: &str = "<crate root>";

/// Where an edge was seen: `file:line`.
type Evidence = String;

/// One crate's module graph: top-level module → referenced module → first place seen.
#[derive(Debug, Default)]
pub struct ModuleGraph {
    pub modules: BTreeSet<String>,
    pub edges: BTreeMap<String, BTreeMap<String, Evidence>>,
}

/// Removes `//` and `/* */` comments (doc comments included) and the contents of string
/// literals, keeping line breaks so line numbers stay right.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == b'"' {
            // A raw string's `r#"` prefix was copied already; its body has no escapes, but
            // an escape-aware skip stops at the same quote for every string warden writes.
            out.push('"');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                if b.get(i) == Some(&b'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            out.push('"');
            i += 1;
        } else if c == b'\'' && b.get(i + 2) == Some(&b'\'') {
            // A char literal such as '"' must not open a string.
            out.push_str("' '");
            i += 3;
        } else if c == b'\'' && b.get(i + 1) == Some(&b'\\') {
            while i < b.len() && !(b[i] == b'\'' && i > 0 && b[i - 1] != b'\\' && b[i - 1] != b'\'') {
                i += 1;
            }
            out.push_str("' '");
            i += 1;
        } else {
            out.push(c as char);
            i += 1;
        }
    }
    out
}

fn ident_at(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// The first path segment of every item in a `{ … }` group (top level of the group only).
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut start = true;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => start = true,
            c if start && depth == 0 && !c.is_whitespace() => {
                start = false;
                let id = ident_at(&group[i..]);
                if !id.is_empty() {
                    heads.push(id.to_owned());
                }
            }
            _ => {}
        }
    }
    heads
}

/// The first segments after each `crate::`, with the 1-based line they appear on.
/// (`super::` is not followed: from a top-level file it names the root, but inside an
/// inline `mod` block the module itself, which a textual check cannot tell apart.)
fn references(code: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    {
        let prefix = "crate::";
        let mut from = 0;
        while let Some(pos) = code[from..].find(prefix) {
            let at = from + pos;
            from = at + prefix.len();
            let preceded_by_ident =
                code[..at].chars().next_back().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
            if preceded_by_ident {
                continue;
            }
            let line = code[..at].matches('\n').count() + 1;
            let rest = &code[from..];
            if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 1;
                let end = group
                    .char_indices()
                    .find(|&(_, c)| {
                        match c {
                            '{' => depth += 1,
                            '}' => depth -= 1,
                            _ => {}
                        }
                        depth == 0
                    })
                    .map_or(group.len(), |(i, _)| i);
                found.extend(group_heads(&group[..end]).into_iter().map(|h| (h, line)));
            } else {
                let id = ident_at(rest);
                if !id.is_empty() {
                    found.push((id.to_owned(), line));
                }
            }
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The module graph of the crate whose sources are in `src`.
pub fn module_graph(src: &Path) -> ModuleGraph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let top_of = |file: &Path| -> String {
        let rel = file.strip_prefix(src).unwrap_or(file);
        let first = rel.components().next().map(|c| c.as_os_str().to_string_lossy().into_owned()).unwrap_or_default();
        match first.strip_suffix(".rs") {
            Some("lib" | "main") => ROOT.to_owned(),
            Some(m) => m.to_owned(),
            None => first,
        }
    };
    let mut graph = ModuleGraph::default();
    for f in &files {
        graph.modules.insert(top_of(f));
    }
    for f in &files {
        let from = top_of(f);
        let Ok(text) = fs::read_to_string(f) else { continue };
        for (head, line) in references(&code_only(&text)) {
            let to = if graph.modules.contains(&head) && head != ROOT { head } else { ROOT.to_owned() };
            if to == from {
                continue;
            }
            let evidence = format!("{}:{line}", f.display());
            graph.edges.entry(from.clone()).or_default().entry(to).or_insert(evidence);
        }
    }
    graph
}

impl ModuleGraph {
    /// Problems: every cycle (a strongly connected component of more than one module) with
    /// the edges inside it; with `root_only_composes`, also every module that reaches up into
    /// the crate root.
    pub fn problems(&self, root_only_composes: bool) -> Vec<String> {
        let mut problems = Vec::new();
        for (from, tos) in &self.edges {
            if root_only_composes
                && from != ROOT
                && let Some(at) = tos.get(ROOT)
            {
                problems.push(format!("module `{from}` uses an item of the crate root ({at}); move it into a module"));
            }
        }
        for scc in self.cycles() {
            let mut lines =
                vec![format!("import cycle between {}:", scc.iter().cloned().collect::<Vec<_>>().join(", "))];
            for from in &scc {
                for (to, at) in self.edges.get(from).into_iter().flatten() {
                    if scc.contains(to) {
                        lines.push(format!("  {from} -> {to} ({at})"));
                    }
                }
            }
            problems.push(lines.join("\n"));
        }
        problems
    }

    /// Strongly connected components with more than one member (Tarjan), root excluded.
    fn cycles(&self) -> Vec<BTreeSet<String>> {
        struct Walk<'a> {
            g: &'a ModuleGraph,
            index: BTreeMap<&'a str, usize>,
            low: BTreeMap<&'a str, usize>,
            stack: Vec<&'a str>,
            on_stack: BTreeSet<&'a str>,
            out: Vec<BTreeSet<String>>,
        }
        impl<'a> Walk<'a> {
            fn visit(&mut self, v: &'a str) {
                let i = self.index.len();
                self.index.insert(v, i);
                self.low.insert(v, i);
                self.stack.push(v);
                self.on_stack.insert(v);
                let g = self.g;
                for w in g.edges.get(v).into_iter().flat_map(|m| m.keys()) {
                    if w == ROOT {
                        continue;
                    }
                    if !self.index.contains_key(w.as_str()) {
                        self.visit(w);
                        let lw = self.low[w.as_str()];
                        let lv = self.low[v];
                        self.low.insert(v, lv.min(lw));
                    } else if self.on_stack.contains(w.as_str()) {
                        let iw = self.index[w.as_str()];
                        let lv = self.low[v];
                        self.low.insert(v, lv.min(iw));
                    }
                }
                if self.low[v] == self.index[v] {
                    let mut scc = BTreeSet::new();
                    while let Some(w) = self.stack.pop() {
                        self.on_stack.remove(w);
                        scc.insert(w.to_owned());
                        if w == v {
                            break;
                        }
                    }
                    if scc.len() > 1 {
                        self.out.push(scc);
                    }
                }
            }
        }
        let mut walk = Walk {
            g: self,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            out: Vec::new(),
        };
        for m in &self.modules {
            if m != ROOT && !walk.index.contains_key(m.as_str()) {
                walk.visit(m);
            }
        }
        walk.out
    }
}

/// Crates whose root (`lib.rs`) only declares modules and composes them: no module may use
/// an item of it. Elsewhere a crate root may hold the crate's shared types (as `models`'
/// `Message`); only cycles between modules count there.
const COMPOSITION_ROOTS: &[&str] = &["host"];

/// The layering problems of the crate whose sources are in `src` (see [`ModuleGraph::problems`]).
pub fn crate_problems(src: &Path) -> Vec<String> {
    let crate_dir = src.parent().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned());
    let root_only_composes = crate_dir.is_some_and(|n| COMPOSITION_ROOTS.contains(&n.as_str()));
    module_graph(src).problems(root_only_composes)
}

/// Every crate's `src` directory in the repository: the workspace members and the guest
/// crates (bundled plugins, test plugins, SDK, templates).
pub fn crate_sources(root: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for parent in [".", "plugins", "tests/plugins", "templates", "sdk"] {
        let Ok(entries) = fs::read_dir(root.join(parent)) else { continue };
        let mut found: Vec<_> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("Cargo.toml").is_file() && p.join("src").is_dir())
            .map(|p| p.join("src"))
            .collect();
        found.sort();
        dirs.extend(found);
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the repository root").to_path_buf()
    }

    #[test]
    fn no_crate_has_an_import_cycle_or_a_module_reaching_into_its_root() {
        let sources = crate_sources(&repo_root());
        assert!(sources.iter().any(|s| s.ends_with("host/src")), "the host crate was not found: {sources:?}");
        let mut problems = Vec::new();
        for src in &sources {
            problems.extend(crate_problems(src));
        }
        assert!(problems.is_empty(), "layering problems:\n{}", problems.join("\n"));
    }

    /// The check itself can fail: a two-module cycle, a root constant, comments and strings.
    #[test]
    fn the_check_finds_a_cycle_and_a_root_item_and_ignores_comments_and_strings() {
        let dir = std::env::temp_dir().join(format!("warden-layering-{}", std::process::id()));
        let src = dir.join("src");
        fs::create_dir_all(src.join("b")).unwrap();
        fs::write(src.join("lib.rs"), "pub mod a; pub mod b; pub mod c; pub const X: u8 = 1;\n").unwrap();
        fs::write(src.join("a.rs"), "use crate::{b::{Y, Z}, c};\n").unwrap();
        fs::write(src.join("b/mod.rs"), "mod inner;\n").unwrap();
        fs::write(src.join("b/inner.rs"), "fn f() { let _ = crate::a::g(); }\n").unwrap();
        fs::write(src.join("c.rs"), "// crate::a\n/* crate::b */ const S: &str = \"crate::a\";\nuse crate::X;\n")
            .unwrap();
        let problems = module_graph(&src).problems(true);
        fs::remove_dir_all(&dir).ok();
        let all = problems.join("\n");
        assert!(all.contains("import cycle between a, b"), "{all}");
        assert!(all.contains("module `c` uses an item of the crate root"), "{all}");
        assert!(!all.contains("c ->"), "comments and strings are not edges: {all}");
        assert_eq!(problems.len(), 2, "{all}");
    }
}
