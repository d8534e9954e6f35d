//! The crate's imports, checked on its source (`src/`, test modules left out): no file may
//! join an import cycle. Files of `src/` import each other through `crate::`, `super::`
//! and `self::` paths (re-exports followed to the file that defines the name); a module
//! and its own child may use each other.
//!
//! A cycle fails here with the imports that close it. The layers of `LAYERS` must also
//! be respected: a file imports its own layer and those below, never one above; an
//! upward import fails naming the file, the line and both layers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A file of `src/`: its module path (`store::memory`) and what it imports.
struct File {
    path: PathBuf,
    imports: Vec<(String, usize)>, // (module path of the target, line)
}

/// Module paths of every file under `src/`.
fn modules(root: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(root).unwrap();
            if rel.starts_with("bin") {
                continue; // binaries use the public API only
            }
            let mut parts: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
                .collect();
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
                parts.pop();
            }
            out.insert(parts.join("::"), path);
        }
    }
    out
}

/// The source without comments, string and char literals (kept as blanks, lines kept),
/// and without `#[cfg(test)]` items.
fn code(source: &str) -> String {
    let b = source.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == b'\n' {
                        out.push(b'\n');
                    }
                    i += 1;
                }
            }
        } else if rest.starts_with(b"r#\"")
            || rest.starts_with(b"r\"")
            || rest.starts_with(b"r##\"")
        {
            let hashes = rest[1..].iter().take_while(|&&c| c == b'#').count();
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            i += 2 + hashes;
            while i < b.len() && !b[i..].starts_with(&close) {
                if b[i] == b'\n' {
                    out.push(b'\n');
                }
                i += 1;
            }
            i += close.len();
            out.extend_from_slice(b"\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                if i < b.len() && b[i] == b'\n' {
                    out.push(b'\n');
                }
                i += 1;
            }
            i += 1;
            out.extend_from_slice(b"\"\"");
        } else if b[i] == b'\'' && (rest.get(2) == Some(&b'\'') || rest.get(1) == Some(&b'\\')) {
            // A char literal ('a', '\n', '\u{..}'); a lifetime has no closing quote.
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.extend_from_slice(b"' '");
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    let text = String::from_utf8(out).unwrap();
    strip_test_items(&text)
}

/// Blanks each item that follows `#[cfg(test)]` (to its closing brace or semicolon).
fn strip_test_items(text: &str) -> String {
    let mut out = text.to_owned().into_bytes();
    let mut from = 0;
    while let Some(at) = text[from..].find("#[cfg(test)]") {
        let start = from + at;
        let bytes = text.as_bytes();
        let mut i = start + "#[cfg(test)]".len();
        let mut depth = 0usize;
        while i < bytes.len() {
            match bytes[i] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        for c in &mut out[start..i.min(bytes.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        from = i.min(bytes.len());
    }
    String::from_utf8(out).unwrap()
}

/// Every path written after `crate::`, `super::` or `self::` (use trees expanded), as
/// absolute module-ish paths, with the line they are on.
fn paths(module: &str, is_mod_file: bool, code: &str) -> Vec<(String, usize)> {
    let here: Vec<&str> = if module.is_empty() {
        vec![]
    } else {
        module.split("::").collect()
    };
    // `super` of a file `a/b.rs` (module a::b) is `a`; of `a/mod.rs` (module a) is the root.
    let _ = is_mod_file;
    let mut out = Vec::new();
    let b = code.as_bytes();
    let line_of = |i: usize| code[..i].bytes().filter(|&c| c == b'\n').count() + 1;
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start) {
            let i = from + at;
            from = i + start.len();
            if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b':') {
                continue;
            }
            let base: Vec<String> = match start {
                "crate::" => vec![],
                "self::" => here.iter().map(|s| s.to_string()).collect(),
                _ => {
                    let mut base: Vec<String> = here.iter().map(|s| s.to_string()).collect();
                    base.pop();
                    let mut j = from;
                    while code[j..].starts_with("super::") {
                        base.pop();
                        j += "super::".len();
                    }
                    from = j;
                    base
                }
            };
            let mut trees = Vec::new();
            tree(code, from, base, &mut trees);
            let line = line_of(i);
            out.extend(trees.into_iter().map(|p| (p.join("::"), line)));
        }
    }
    out
}

/// Expands the use tree (or plain path) starting at `i` into `out`.
fn tree(code: &str, mut i: usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let b = code.as_bytes();
    let mut path = prefix;
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i < b.len() && b[i] == b'{' {
            i += 1;
            loop {
                while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
                    i += 1;
                }
                if i >= b.len() || b[i] == b'}' {
                    return i + 1;
                }
                i = tree(code, i, path.clone(), out);
            }
        }
        let s = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        if s == i {
            out.push(path);
            return i;
        }
        let ident = &code[s..i];
        if ident != "self" {
            path.push(ident.to_owned());
        }
        if code[i..].starts_with("::") {
            i += 2;
            continue;
        }
        out.push(path);
        // Skip `as name` and anything up to the next separator of the tree.
        while i < b.len() && !matches!(b[i], b',' | b'}' | b';' | b'\n') {
            i += 1;
        }
        return i;
    }
}

/// The names each module re-exports (`pub use`, `pub(crate) use`): name → full path.
fn reexports(modules: &BTreeMap<String, PathBuf>) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (module, path) in modules {
        let text = code(&std::fs::read_to_string(path).unwrap());
        let mut from = 0;
        while let Some(at) = text[from..].find("use ") {
            let i = from + at;
            from = i + 4;
            let head = text[..i].trim_end();
            if !(head.ends_with("pub") || head.ends_with(')')) {
                continue;
            }
            let mut j = from;
            let base: Vec<String> = if text[j..].starts_with("crate::") {
                j += 7;
                vec![]
            } else if text[j..].starts_with("self::") {
                j += 6;
                module
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            } else if text[j..].starts_with("super::") {
                let mut b: Vec<String> = module
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect();
                b.pop();
                j += 7;
                b
            } else {
                // A child module's name.
                module
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            };
            let mut trees = Vec::new();
            tree(&text, j, base, &mut trees);
            for t in trees {
                if let Some(name) = t.last() {
                    out.entry(module.clone())
                        .or_default()
                        .insert(name.clone(), t.join("::"));
                }
            }
        }
    }
    out
}

/// The file a path leads to: the longest module prefix that is a file, following
/// re-exports.
fn resolve(
    path: &str,
    modules: &BTreeMap<String, PathBuf>,
    reexports: &BTreeMap<String, BTreeMap<String, String>>,
    depth: usize,
) -> Option<String> {
    let parts: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let n = (0..=parts.len())
        .rev()
        .find(|&n| modules.contains_key(&parts[..n].join("::")))?;
    let module = parts[..n].join("::");
    if depth < 8
        && let Some(next) = parts.get(n)
        && let Some(target) = reexports.get(&module).and_then(|r| r.get(*next))
        && target != path
    {
        let rest = parts[n + 1..].join("::");
        let full = if rest.is_empty() {
            target.clone()
        } else {
            format!("{target}::{rest}")
        };
        return resolve(&full, modules, reexports, depth + 1).or(Some(module));
    }
    Some(module)
}

fn load(root: &Path) -> BTreeMap<String, File> {
    let modules = modules(root);
    let reexports = reexports(&modules);
    let mut files = BTreeMap::new();
    for (module, path) in &modules {
        let source = std::fs::read_to_string(path).unwrap();
        let is_mod = path
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs");
        let mut imports = Vec::new();
        for (p, line) in paths(module, is_mod, &code(&source)) {
            if let Some(target) = resolve(&p, &modules, &reexports, 0)
                && target != *module
            {
                imports.push((target, line));
            }
        }
        files.insert(
            module.clone(),
            File {
                path: path.clone(),
                imports,
            },
        );
    }
    files
}

fn is_parent(a: &str, b: &str) -> bool {
    a.is_empty() || b.strip_prefix(a).is_some_and(|rest| rest.starts_with("::"))
}

/// Strongly connected components (Tarjan, iterative enough for a crate's files).
fn cycles(edges: &BTreeMap<&str, BTreeSet<&str>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        for &w in t.edges.get(v).into_iter().flatten() {
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in edges.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// The layers of `src/`, bottom first: a file may import its own layer and the layers
/// below it, never one above. A file belongs to the layer of its longest listed prefix.
/// The observability sinks sit below the stores, which report to them; everything above
/// may report to them too, and they import only base, algorithms and vocabulary.
const LAYERS: &[(&str, &[&str])] = &[
    ("base", &["base"]),
    ("algorithms", &["algo"]),
    ("vocabulary", &["model"]),
    (
        "observability sinks",
        &[
            "observe",
            "audit",
            "audit::queue",
            "audit::sink",
            "audit::trace",
            "audit::violation",
        ],
    ),
    ("stores", &["store"]),
    ("engine", &["engine"]),
    ("handle", &["limiter"]),
    ("HTTP policy", &["web", "audit::record"]),
    ("tower middleware", &["middleware"]),
    ("configuration", &["rules", "sql"]),
    // The simulation kit (feature `testing`): a backend and instances for users' tests,
    // over the stores; nothing imports it.
    ("testing kit", &["testing"]),
    // The guide's chapters (`guide/*.md`) as modules: docs only, no code, no imports.
    ("guide", &["guide"]),
];

/// The layer of a module path: (index, name); `None` for the crate root.
fn layer_of(module: &str) -> Option<(usize, &'static str)> {
    let mut best: Option<(usize, usize, &'static str)> = None;
    for (i, (name, prefixes)) in LAYERS.iter().enumerate() {
        for p in *prefixes {
            if (module == *p || is_parent(p, module)) && best.is_none_or(|b| p.len() > b.0) {
                best = Some((p.len(), i, name));
            }
        }
    }
    best.map(|(_, i, name)| (i, name))
}

/// Every import that points up the layers, as "file (line N) imports module: layer a
/// may not import layer b".
fn upward_imports(files: &BTreeMap<String, File>) -> Vec<String> {
    let mut out = Vec::new();
    for (m, f) in files {
        let mut seen = BTreeSet::new();
        let Some((from, from_name)) = layer_of(m) else {
            continue;
        };
        for (t, line) in &f.imports {
            let Some((to, to_name)) = layer_of(t) else {
                continue;
            };
            if to > from && seen.insert((t, line)) {
                out.push(format!(
                    "{} (line {line}) imports {t}: the {from_name} layer may not import the {to_name} layer above it",
                    f.path.display()
                ));
            }
        }
    }
    out
}

#[test]
fn every_file_has_a_layer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../src");
    let missing: Vec<String> = load(&root)
        .keys()
        .filter(|m| !m.is_empty() && layer_of(m).is_none())
        .cloned()
        .collect();
    assert!(
        missing.is_empty(),
        "files of src/ in no layer of LAYERS: {missing:?}"
    );
}

#[test]
fn imports_point_down_the_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../src");
    let up = upward_imports(&load(&root));
    assert!(up.is_empty(), "imports that point up:\n{}", up.join("\n"));
}

#[test]
fn no_file_joins_an_import_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../src");
    let files = load(&root);
    assert!(
        files.len() > 40,
        "the source was read: {} files",
        files.len()
    );
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (m, f) in &files {
        let e = edges.entry(m.as_str()).or_default();
        for (t, _) in &f.imports {
            if !(is_parent(m, t) || is_parent(t, m)) {
                e.insert(t.as_str());
            }
        }
    }
    let mut problems = Vec::new();
    for cycle in cycles(&edges) {
        let mut text = format!(
            "import cycle of {} files: {}",
            cycle.len(),
            cycle.join(", ")
        );
        for a in &cycle {
            for (t, line) in &files[a].imports {
                if cycle.contains(t) && !(is_parent(a, t) || is_parent(t, a)) {
                    text.push_str(&format!(
                        "\n  {} (line {line}) imports {t}",
                        files[a].path.display()
                    ));
                }
            }
        }
        problems.push(text);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checker_sees_use_trees_re_exports_and_super() {
    let code = code(
        "use crate::{a::B, c::{self, d::E}};\n// use crate::x;\nfn f() { super::g(); \"crate::y\"; }\n",
    );
    let found: Vec<String> = paths("m::n", false, &code)
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert!(found.contains(&"a::B".to_owned()), "{found:?}");
    assert!(found.contains(&"c".to_owned()), "{found:?}");
    assert!(found.contains(&"c::d::E".to_owned()), "{found:?}");
    assert!(found.contains(&"m::g".to_owned()), "{found:?}");
    assert!(
        !found
            .iter()
            .any(|p| p.starts_with('x') || p.starts_with('y')),
        "{found:?}"
    );
}

#[test]
fn a_planted_upward_import_is_named_with_its_file_line_and_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../src");
    let mut files = load(&root);
    // The engine reaching up into the HTTP policy, as `use crate::web::policy::Policy;`.
    let engine = files.get_mut("engine").expect("src/engine/mod.rs");
    engine.imports.push(("web::policy".to_owned(), 12));
    let up = upward_imports(&files);
    let planted: Vec<&String> = up
        .iter()
        .filter(|m| m.contains("imports web::policy"))
        .collect();
    assert_eq!(planted.len(), 1, "{up:?}");
    assert!(
        planted[0].ends_with(
            "src/engine/mod.rs (line 12) imports web::policy: the engine layer may not import the HTTP policy layer above it"
        ),
        "{}",
        planted[0]
    );
}
