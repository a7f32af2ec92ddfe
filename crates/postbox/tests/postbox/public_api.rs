//! The crate's public API, checked against `tests/public-api.txt`: every item a user can name
//! (through `pub mod` and `pub use` from `lib.rs`), one line each with its kind, read from the
//! source with `syn`. A change to the public surface changes the list; the test fails with the
//! difference until the list is regenerated:
//!
//! ```text
//! POSTBOX_UPDATE_API=1 cargo test -p postbox --all-features public_api
//! ```
//!
//! Items behind any feature are listed (the list is the `--all-features` surface); `cfg(test)`
//! modules are left out. Items that a `macro_rules!` of the crate generates cannot be read from
//! the source: a re-export of one is listed with the kind `macro-generated`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use syn::{Attribute, ImplItem, Item, TraitItem, UseTree, Visibility};

const SNAPSHOT: &str = "tests/public-api.txt";
const UPDATE: &str = "POSTBOX_UPDATE_API=1 cargo test -p postbox --all-features public_api";

/// What a name in a module stands for.
#[derive(Clone, Debug)]
enum Entry {
    /// An item defined here: its kind and, for a module, its index.
    Def { kind: String, module: Option<usize> },
    /// A `use`: the path it imports (`*` last for a glob).
    Use(Vec<String>),
}

#[derive(Debug, Default)]
struct Module {
    parent: Option<usize>,
    /// Every name, with whether it is `pub` (plain `pub` only).
    names: Vec<(String, bool, Entry)>,
    /// `pub` members of the types and traits defined here (`Type::member`, kind).
    members: Vec<(String, String, String)>,
}

/// What a name resolves to: its kind, the module it is (for a module), and where it is defined
/// (module index and name) for an item of the crate.
struct Target {
    kind: String,
    module: Option<usize>,
    origin: Option<(usize, String)>,
}

impl Target {
    fn other(kind: String) -> Target {
        Target {
            kind,
            module: None,
            origin: None,
        }
    }
}

struct Crate {
    modules: Vec<Module>,
    macros: Vec<String>,
}

fn is_cfg_test(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

fn is_pub(vis: &Visibility) -> bool {
    matches!(vis, Visibility::Public(_))
}

fn uses(tree: &UseTree, prefix: &mut Vec<String>, out: &mut Vec<(String, Vec<String>)>) {
    match tree {
        UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            uses(&p.tree, prefix, out);
            prefix.pop();
        }
        UseTree::Name(n) => {
            let name = n.ident.to_string();
            let mut path = prefix.clone();
            path.push(name.clone());
            if name == "self" {
                path.pop();
                let last = path.last().cloned().unwrap_or_default();
                out.push((last, path));
            } else {
                out.push((name, path));
            }
        }
        UseTree::Rename(r) => {
            let mut path = prefix.clone();
            path.push(r.ident.to_string());
            out.push((r.rename.to_string(), path));
        }
        UseTree::Glob(_) => {
            let mut path = prefix.clone();
            path.push("*".into());
            out.push(("*".into(), path));
        }
        UseTree::Group(g) => g.items.iter().for_each(|t| uses(t, prefix, out)),
    }
}

fn members_of(item: &Item, module: &mut Module) {
    match item {
        Item::Struct(s) if is_pub(&s.vis) => {
            for f in &s.fields {
                if let (true, Some(name)) = (is_pub(&f.vis), &f.ident) {
                    module
                        .members
                        .push((s.ident.to_string(), name.to_string(), "field".into()));
                }
            }
        }
        Item::Enum(e) if is_pub(&e.vis) => {
            for v in &e.variants {
                module
                    .members
                    .push((e.ident.to_string(), v.ident.to_string(), "variant".into()));
            }
        }
        Item::Trait(t) if is_pub(&t.vis) => {
            for i in &t.items {
                let (name, kind) = match i {
                    TraitItem::Fn(f) => (f.sig.ident.to_string(), "trait fn"),
                    TraitItem::Const(c) => (c.ident.to_string(), "trait const"),
                    TraitItem::Type(t) => (t.ident.to_string(), "trait type"),
                    _ => continue,
                };
                module
                    .members
                    .push((t.ident.to_string(), name, kind.into()));
            }
        }
        _ => {}
    }
}

impl Crate {
    fn load(src: &Path) -> Crate {
        let mut krate = Crate {
            modules: Vec::new(),
            macros: Vec::new(),
        };
        let mut impls = Vec::new();
        krate.file(&src.join("lib.rs"), src.to_path_buf(), None, &mut impls);
        // Inherent methods: by the type's name, on the type of that name in the same module
        // tree (the crate's public types have distinct names).
        for (type_name, methods) in impls {
            for m in &mut krate.modules {
                if m.names.iter().any(|(n, p, e)| {
                    *p && *n == type_name && matches!(e, Entry::Def { kind, .. } if kind != "mod")
                }) {
                    for method in &methods {
                        m.members
                            .push((type_name.clone(), method.clone(), "method".into()));
                    }
                }
            }
        }
        krate
    }

    fn file(
        &mut self,
        file: &Path,
        dir: PathBuf,
        parent: Option<usize>,
        impls: &mut Vec<(String, Vec<String>)>,
    ) -> usize {
        let text = std::fs::read_to_string(file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let parsed =
            syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", file.display()));
        self.items(&parsed.items, dir, parent, impls)
    }

    fn items(
        &mut self,
        items: &[Item],
        dir: PathBuf,
        parent: Option<usize>,
        impls: &mut Vec<(String, Vec<String>)>,
    ) -> usize {
        let id = self.modules.len();
        self.modules.push(Module {
            parent,
            ..Module::default()
        });
        for item in items {
            let (name, public, kind) = match item {
                Item::Mod(m) => {
                    if is_cfg_test(&m.attrs) {
                        continue;
                    }
                    let name = m.ident.to_string();
                    let child = match &m.content {
                        Some((_, inner)) => self.items(inner, dir.join(&name), Some(id), impls),
                        None => {
                            let flat = dir.join(format!("{name}.rs"));
                            let (file, child_dir) = if flat.exists() {
                                (flat, dir.join(&name))
                            } else {
                                (dir.join(&name).join("mod.rs"), dir.join(&name))
                            };
                            self.file(&file, child_dir, Some(id), impls)
                        }
                    };
                    self.modules[id].names.push((
                        name,
                        is_pub(&m.vis),
                        Entry::Def {
                            kind: "mod".into(),
                            module: Some(child),
                        },
                    ));
                    continue;
                }
                Item::Use(u) => {
                    let mut found = Vec::new();
                    uses(&u.tree, &mut Vec::new(), &mut found);
                    for (name, path) in found {
                        self.modules[id]
                            .names
                            .push((name, is_pub(&u.vis), Entry::Use(path)));
                    }
                    continue;
                }
                Item::Macro(m) => {
                    let exported = m.attrs.iter().any(|a| a.path().is_ident("macro_export"));
                    if let (true, Some(ident)) = (exported, &m.ident) {
                        self.macros.push(ident.to_string());
                    }
                    continue;
                }
                Item::Impl(i) if i.trait_.is_none() => {
                    if let syn::Type::Path(p) = &*i.self_ty {
                        let methods = i
                            .items
                            .iter()
                            .filter_map(|ii| match ii {
                                ImplItem::Fn(f) if is_pub(&f.vis) => Some(f.sig.ident.to_string()),
                                ImplItem::Const(c) if is_pub(&c.vis) => Some(c.ident.to_string()),
                                _ => None,
                            })
                            .collect();
                        if let Some(last) = p.path.segments.last() {
                            impls.push((last.ident.to_string(), methods));
                        }
                    }
                    continue;
                }
                Item::Fn(f) => (f.sig.ident.to_string(), is_pub(&f.vis), "fn"),
                Item::Struct(s) => (s.ident.to_string(), is_pub(&s.vis), "struct"),
                Item::Enum(e) => (e.ident.to_string(), is_pub(&e.vis), "enum"),
                Item::Trait(t) => (t.ident.to_string(), is_pub(&t.vis), "trait"),
                Item::Type(t) => (t.ident.to_string(), is_pub(&t.vis), "type"),
                Item::Const(c) => (c.ident.to_string(), is_pub(&c.vis), "const"),
                Item::Static(s) => (s.ident.to_string(), is_pub(&s.vis), "static"),
                Item::Union(u) => (u.ident.to_string(), is_pub(&u.vis), "union"),
                _ => continue,
            };
            members_of(item, &mut self.modules[id]);
            self.modules[id].names.push((
                name,
                public,
                Entry::Def {
                    kind: kind.into(),
                    module: None,
                },
            ));
        }
        id
    }

    /// The module a path's leading segments name, from module `at`; `None` outside the crate.
    fn module(&self, at: usize, path: &[String]) -> Option<usize> {
        let mut current = at;
        for (i, segment) in path.iter().enumerate() {
            current = match segment.as_str() {
                "crate" if i == 0 => 0,
                "self" if i == 0 => current,
                "super" => self.modules[current].parent?,
                name => {
                    let direct = self.modules[current]
                        .names
                        .iter()
                        .find_map(|(n, _, e)| match e {
                            Entry::Def { kind, module } if n == name && kind == "mod" => *module,
                            _ => None,
                        });
                    match direct {
                        Some(m) => m,
                        None => self
                            .lookup(current, name)
                            .into_iter()
                            .find_map(|t| (t.kind == "mod").then_some(t.module).flatten())?,
                    }
                }
            };
        }
        Some(current)
    }

    /// What `name` stands for in module `at`, through `use`s.
    fn lookup(&self, at: usize, name: &str) -> Vec<Target> {
        let mut out = Vec::new();
        for (n, _, entry) in &self.modules[at].names {
            if n != name {
                continue;
            }
            match entry {
                Entry::Def { kind, module } => out.push(Target {
                    kind: kind.clone(),
                    module: *module,
                    origin: Some((at, name.to_string())),
                }),
                Entry::Use(path) => out.extend(self.resolve(at, path)),
            }
        }
        for (n, _, entry) in &self.modules[at].names {
            if let (true, Entry::Use(path)) = (n == "*", entry)
                && let Some(target) = self.module(at, &path[..path.len() - 1])
                && self.modules[target]
                    .names
                    .iter()
                    .any(|(n, p, _)| *p && n == name)
            {
                out.extend(self.lookup(target, name));
            }
        }
        out
    }

    /// What the path of a `use` in module `at` imports.
    fn resolve(&self, at: usize, path: &[String]) -> Vec<Target> {
        let (last, front) = path.split_last().expect("a use path has a segment");
        match self.module(at, front) {
            Some(m) if !front.is_empty() => {
                let found = self.lookup(m, last);
                if found.is_empty() {
                    vec![Target::other("macro-generated".into())]
                } else {
                    found
                }
            }
            _ => vec![Target::other(format!("re-export of {}", path.join("::")))],
        }
    }

    /// One line per public item of module `at`, named from `prefix`.
    fn list(&self, at: usize, prefix: &str, out: &mut BTreeSet<String>, seen: &mut Vec<usize>) {
        if seen.contains(&at) {
            return;
        }
        seen.push(at);
        for (name, public, entry) in &self.modules[at].names {
            if !public {
                continue;
            }
            let targets = match entry {
                Entry::Def { kind, module } => vec![Target {
                    kind: kind.clone(),
                    module: *module,
                    origin: Some((at, name.clone())),
                }],
                Entry::Use(path) if name == "*" => {
                    if let Some(target) = self.module(at, &path[..path.len() - 1]) {
                        self.list(target, prefix, out, seen);
                    }
                    continue;
                }
                Entry::Use(path) => self.resolve(at, path),
            };
            for target in targets {
                out.insert(format!("{prefix}::{name} {}", target.kind));
                if let Some((origin, ty)) = &target.origin {
                    for (of, member, kind) in &self.modules[*origin].members {
                        if of == ty {
                            out.insert(format!("{prefix}::{name}::{member} {kind}"));
                        }
                    }
                }
                if let Some(m) = target.module {
                    self.list(m, &format!("{prefix}::{name}"), out, seen);
                }
            }
        }
        seen.pop();
    }
}

/// The public API as the snapshot lists it.
fn public_api() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let krate = Crate::load(&root.join("src"));
    let mut out = BTreeSet::new();
    krate.list(0, "postbox", &mut out, &mut Vec::new());
    for m in &krate.macros {
        out.insert(format!("postbox::{m} macro"));
    }
    let mut text = String::from(
        "# The public API of the postbox crate, one item a line (tests/postbox/public_api.rs).\n",
    );
    text.push_str(&format!("# Regenerate: {UPDATE}\n"));
    for line in out {
        text.push_str(&line);
        text.push('\n');
    }
    text
}

#[test]
fn public_api_matches_snapshot() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(SNAPSHOT);
    let now = public_api();
    if std::env::var_os("POSTBOX_UPDATE_API").is_some() {
        std::fs::write(&path, &now).expect("writing the public-API snapshot");
        return;
    }
    let saved = std::fs::read_to_string(&path).unwrap_or_default();
    if saved == now {
        return;
    }
    let old: BTreeSet<&str> = saved.lines().collect();
    let new: BTreeSet<&str> = now.lines().collect();
    let mut diff = String::new();
    for line in old.difference(&new) {
        diff.push_str(&format!("- {line}\n"));
    }
    for line in new.difference(&old) {
        diff.push_str(&format!("+ {line}\n"));
    }
    panic!(
        "the public API differs from {SNAPSHOT} (- listed there, + in the source now):\n{diff}\n\
         If the change is deliberate, update the list with:\n    {UPDATE}"
    );
}
