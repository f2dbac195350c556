//! The layers import only downwards: app → ui → model → gpu (docs/ARCHITECTURE.md). A `use` that
//! runs back up fails here, naming the file and line. Inside each folder the files (and
//! sub-folders, each counted as one) import each other without a circle, so that every room has
//! a bottom (types) and a top (what uses them); a circle fails here, naming each import in it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn src_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The layers above each layer: what its files may not name.
const ABOVE: [(&str, &[&str]); 3] = [
    ("gpu", &["model", "ui", "app"]),
    ("model", &["ui", "app"]),
    ("ui", &["app"]),
];

/// The paths in `code` (the text of the file of module `module`) that resolve into one of the
/// layers `above`: (line, the path as resolved). Through the same parser as the circle check, so
/// that `super::super::model`, `crate::{model::X}` and a path written inline count, and a
/// comment or a string does not.
fn upward_references(code: &str, module: &[String], above: &[&str]) -> Vec<(usize, String)> {
    references(&code_only(code), module)
        .into_iter()
        .filter_map(|r| {
            let target = resolve(&r.path, &r.module)?;
            let top = target.first()?;
            above
                .contains(&top.as_str())
                .then(|| (r.line, format!("crate::{}", target.join("::"))))
        })
        .collect()
}

#[test]
fn no_layer_imports_a_layer_above_it() {
    let root = src_root();
    let mut bad = Vec::new();
    for (layer, above) in ABOVE {
        let mut files = Vec::new();
        sources(&root.join(layer), &mut files);
        assert!(!files.is_empty(), "no sources under src/{layer}");
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for (line, target) in upward_references(&text, &module_path(&root, &f), above) {
                let written = lines.get(line - 1).map_or("", |l| l.trim());
                bad.push(format!("{}:{line}: {target} ({written})", f.display()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "imports against the layering:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_layer_check_sees_what_a_substring_match_missed_and_ignores_what_it_flagged() {
    // A made-up file in gpu/hip/: an upward import through `super`, one inside a braced group,
    // one written inline; and a comment and a string that only mention a layer above.
    let text = "use super::super::super::model::Config;\n\
                use crate::{gpu::Gpu, ui::Panel};\n\
                // crate::app is above us; so is crate::model.\n\
                fn f() { let s = \"crate::app::x\"; crate::app::quit::now(); }\n";
    let module: Vec<String> = vec!["gpu".into(), "hip".into(), "ffi".into()];
    let found = upward_references(text, &module, ABOVE[0].1);
    assert_eq!(
        found,
        vec![
            (1, "crate::model::Config".to_string()),
            (2, "crate::ui::Panel".to_string()),
            (4, "crate::app::quit::now".to_string()),
        ]
    );
    // The same file in ui/: only the app is above it.
    let module: Vec<String> = vec!["ui".into(), "hip".into(), "ffi".into()];
    assert_eq!(
        upward_references(text, &module, ABOVE[2].1),
        vec![(4, "crate::app::quit::now".to_string())]
    );
}

// ---- import circles inside a folder ----

/// The text of a Rust file with comments, strings and character literals blanked out (newlines
/// kept, so that line numbers still hold).
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if c[i] == 'r' && (next == Some('"') || next == Some('#')) && {
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            c.get(j) == Some(&'"') && (i == 0 || !(c[i - 1].is_alphanumeric() || c[i - 1] == '_'))
        } {
            // Raw string r#"..."#.
            let mut hashes = 0;
            let mut j = i + 1;
            while c[j] == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            while j < c.len() {
                if c[j] == '"' && (0..hashes).all(|k| c.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &ch in &c[i..j.min(c.len())] {
                blank(&mut out, ch);
            }
            i = j;
        } else if c[i] == '"' {
            blank(&mut out, c[i]);
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            if i < c.len() {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '\'' && next == Some('\\') {
            // '\n', '\'', '\u{..}'
            let mut j = i + 2;
            while j < c.len() && c[j] != '\'' {
                j += 1;
            }
            for &ch in &c[i..=j.min(c.len() - 1)] {
                blank(&mut out, ch);
            }
            i = j + 1;
        } else if c[i] == '\'' && c.get(i + 2) == Some(&'\'') {
            out.push_str("   ");
            i += 3;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Path, // ::
    Punct(char),
}

fn tokens(code: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphanumeric() || ch == '_' {
            let s = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(c[s..i].iter().collect()), line));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// Expands a `use` tree starting at `t[*i]` into full paths (as written), advancing `*i`.
fn use_tree(t: &[(Tok, usize)], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    loop {
        match t.get(*i).map(|x| &x.0) {
            Some(Tok::Ident(s)) if s == "as" => {
                *i += 2; // `as name`
                out.push(path);
                return;
            }
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                *i += 1;
            }
            Some(Tok::Path) => *i += 1,
            Some(Tok::Punct('{')) => {
                *i += 1;
                loop {
                    match t.get(*i).map(|x| &x.0) {
                        Some(Tok::Punct('}')) => {
                            *i += 1;
                            return;
                        }
                        Some(Tok::Punct(',')) => *i += 1,
                        None => return,
                        _ => use_tree(t, i, &path, out),
                    }
                }
            }
            Some(Tok::Punct('*')) => {
                *i += 1;
                out.push(path);
                return;
            }
            _ => {
                out.push(path);
                return;
            }
        }
    }
}

/// A module path reference found in a file: where, and the module it is written in (inline
/// `mod x { .. }` blocks included, so that their `super` resolves right).
struct Reference {
    line: usize,
    path: Vec<String>,
    module: Vec<String>,
}

fn references(code: &str, module: &[String]) -> Vec<Reference> {
    let t = tokens(code);
    let mut out = Vec::new();
    // Inline module stack: (name, brace depth at which it opened).
    let mut stack: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut pending_mod: Option<String> = None;
    let current = |stack: &[(String, usize)]| {
        let mut m = module.to_vec();
        m.extend(stack.iter().map(|(n, _)| n.clone()));
        m
    };
    let mut i = 0;
    while i < t.len() {
        match &t[i].0 {
            Tok::Punct('{') => {
                depth += 1;
                if let Some(name) = pending_mod.take() {
                    stack.push((name, depth));
                }
                i += 1;
            }
            Tok::Punct('}') => {
                if stack.last().is_some_and(|(_, d)| *d == depth) {
                    stack.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Tok::Punct(';') => {
                pending_mod = None;
                i += 1;
            }
            Tok::Ident(s) if s == "mod" => {
                if let Some((Tok::Ident(name), _)) = t.get(i + 1) {
                    pending_mod = Some(name.clone());
                }
                i += 2;
            }
            Tok::Ident(s) if s == "use" => {
                let line = t[i].1;
                i += 1;
                let mut paths = Vec::new();
                use_tree(&t, &mut i, &[], &mut paths);
                for path in paths {
                    out.push(Reference {
                        line,
                        path,
                        module: current(&stack),
                    });
                }
            }
            Tok::Ident(s)
                if (s == "crate" || s == "super" || s == "self")
                    && t.get(i + 1).map(|x| &x.0) == Some(&Tok::Path)
                    && !(i > 0 && t[i - 1].0 == Tok::Path) =>
            {
                let line = t[i].1;
                let mut path = vec![s.clone()];
                i += 1;
                while t.get(i).map(|x| &x.0) == Some(&Tok::Path) {
                    match t.get(i + 1) {
                        Some((Tok::Ident(n), _)) => {
                            path.push(n.clone());
                            i += 2;
                        }
                        _ => break,
                    }
                }
                out.push(Reference {
                    line,
                    path,
                    module: current(&stack),
                });
            }
            _ => i += 1,
        }
    }
    out
}

/// Resolves `crate::`, `super::` and `self::` against the module the path is written in;
/// `None` for paths into other crates.
fn resolve(path: &[String], module: &[String]) -> Option<Vec<String>> {
    let mut base: Vec<String>;
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            base = Vec::new();
            rest = &path[1..];
        }
        Some("self") => {
            base = module.to_vec();
            rest = &path[1..];
        }
        Some("super") => {
            base = module.to_vec();
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// A source file's module path: `src/gpu/hip/ffi.rs` → `[gpu, hip, ffi]`, `src/gpu/hip/mod.rs`
/// → `[gpu, hip]`.
fn module_path(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

#[test]
fn no_import_circle_inside_a_folder() {
    let root = src_root();
    let mut files = Vec::new();
    sources(&root, &mut files);
    // Every module, with whether it is a folder (mod.rs) and what it re-exports (`pub use`).
    let mut modules: BTreeMap<Vec<String>, (PathBuf, Vec<Reference>)> = BTreeMap::new();
    let mut reexports: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
    for f in &files {
        if f.file_name()
            .is_some_and(|n| n == "lib.rs" || n == "main.rs")
        {
            continue;
        }
        let m = module_path(&root, f);
        let text = std::fs::read_to_string(f).unwrap();
        let code = code_only(&text);
        let refs = references(&code, &m);
        // `pub use child::Name;` in a folder's mod.rs: Name stands for child.
        if f.file_name().is_some_and(|n| n == "mod.rs") {
            for line in code.lines() {
                let l = line.trim_start();
                if let Some(rest) = l.strip_prefix("pub use ") {
                    let mut i = 0;
                    let t = tokens(rest);
                    let mut paths = Vec::new();
                    use_tree(&t, &mut i, &[], &mut paths);
                    for p in paths {
                        if let (Some(first), Some(last)) = (p.first(), p.last())
                            && first != "crate"
                            && first != "super"
                            && first != "std"
                        {
                            let mut name = m.clone();
                            name.push(last.clone());
                            let mut child = m.clone();
                            child.push(first.clone());
                            reexports.insert(name, child);
                        }
                    }
                }
            }
        }
        modules.insert(m, (f.clone(), refs));
    }
    // Edges between siblings: for a folder F, child A → child B when a file of A names B.
    // A folder's own mod.rs is its face, not one of its children, and takes part in no circle.
    type Edge = (String, String);
    let mut edges: BTreeMap<Vec<String>, BTreeMap<Edge, String>> = BTreeMap::new();
    for (m, (file, refs)) in &modules {
        for r in refs {
            let Some(mut target) = resolve(&r.path, &r.module) else {
                continue;
            };
            // A name re-exported by a folder stands for the child that defines it.
            for k in (1..=target.len()).rev() {
                if let Some(child) = reexports.get(&target[..k]) {
                    target = child.clone();
                    break;
                }
            }
            // The deepest folder both lie in.
            let common = m.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common >= m.len() || common >= target.len() {
                continue; // into its own module, or from a folder's face into its children
            }
            let folder = m[..common].to_vec();
            let from = m[common].clone();
            let to = target[common].clone();
            let to_module: Vec<String> = target[..=common].to_vec();
            if !modules.contains_key(&to_module) {
                continue; // an item defined in the folder's mod.rs, not a child
            }
            let from_module: Vec<String> = m[..=common].to_vec();
            if !modules.contains_key(&from_module) {
                continue;
            }
            edges
                .entry(folder)
                .or_default()
                .entry((from, to))
                .or_insert_with(|| {
                    format!(
                        "{}:{}",
                        file.strip_prefix(root.parent().unwrap()).unwrap().display(),
                        r.line
                    )
                });
        }
    }
    let mut circles = Vec::new();
    for (folder, es) in &edges {
        let nodes: BTreeSet<&String> = es.keys().flat_map(|(a, b)| [a, b]).collect();
        for scc in strongly_connected(&nodes, es) {
            if scc.len() < 2 {
                continue;
            }
            let mut lines = vec![format!(
                "src/{}: {} import each other in a circle:",
                folder.join("/"),
                scc.iter().cloned().collect::<Vec<_>>().join(", ")
            )];
            for ((a, b), at) in es {
                if scc.contains(a) && scc.contains(b) {
                    lines.push(format!("    {a} → {b} ({at})"));
                }
            }
            circles.push(lines.join("\n"));
        }
    }
    assert!(
        circles.is_empty(),
        "import circles inside a folder (give the folder a bottom and a top):\n{}",
        circles.join("\n")
    );
}

/// Tarjan's strongly connected components.
fn strongly_connected(
    nodes: &BTreeSet<&String>,
    edges: &BTreeMap<(String, String), String>,
) -> Vec<BTreeSet<String>> {
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        on_stack: BTreeSet<&'a str>,
        stack: Vec<&'a str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(v: &'a str, adj: &BTreeMap<&'a str, Vec<&'a str>>, s: &mut State<'a>) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in adj.get(v).map(Vec::as_slice).unwrap_or(&[]) {
            if !s.index.contains_key(w) {
                visit(w, adj, s);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                scc.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            s.out.push(scc);
        }
    }
    let mut adj: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        adj.entry(a.as_str()).or_default().push(b.as_str());
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        on_stack: BTreeSet::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for n in nodes {
        if !s.index.contains_key(n.as_str()) {
            visit(n, &adj, &mut s);
        }
    }
    s.out
}

#[test]
fn the_circle_check_sees_a_circle() {
    // The checker itself, on a made-up pair of files: a → b by `use`, b → a by an inline path
    // inside a braced group and through `super`.
    let a = references(
        &code_only("use crate::gpu::{b::B, c};\n"),
        &["gpu".into(), "a".into()],
    );
    let b = references(
        &code_only("// use crate::gpu::c;\nfn f() { let s = \"crate::gpu::c\"; super::a::f(); }\n"),
        &["gpu".into(), "b".into()],
    );
    let ra: Vec<_> = a
        .iter()
        .filter_map(|r| resolve(&r.path, &r.module))
        .collect();
    let rb: Vec<_> = b
        .iter()
        .filter_map(|r| resolve(&r.path, &r.module))
        .collect();
    assert_eq!(ra, vec![vec!["gpu", "b", "B"], vec!["gpu", "c"]]);
    // Comments and strings are not imports; `super::a::f` is.
    assert_eq!(rb, vec![vec!["gpu", "a", "f"]]);
    let mut es = BTreeMap::new();
    es.insert(("a".to_string(), "b".to_string()), String::new());
    es.insert(("b".to_string(), "a".to_string()), String::new());
    es.insert(("b".to_string(), "c".to_string()), String::new());
    let (na, nb, nc) = ("a".to_string(), "b".to_string(), "c".to_string());
    let nodes: BTreeSet<&String> = [&na, &nb, &nc].into_iter().collect();
    let sccs = strongly_connected(&nodes, &es);
    assert!(
        sccs.iter()
            .any(|s| s.len() == 2 && s.contains("a") && s.contains("b"))
    );
    assert!(sccs.iter().all(|s| !s.contains("c") || s.len() == 1));
}
