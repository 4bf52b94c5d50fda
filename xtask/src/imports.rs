//! `cargo xtask check-imports`: no import circles in any crate of the workspace.
//!
//! Each crate is read as a tree of modules (a file, or a folder with its `mod.rs`). A module
//! that names an item of another module depends on it. Within each folder (and the crate
//! root), the children are nodes of one graph: a dependency between two files or subfolders
//! is an edge between the two children of their nearest common parent that hold them. A
//! module's use of its own ancestors, or of its own descendants, is not an edge (a child
//! reads its parent's items, a parent declares its children). A circle among siblings is
//! reported with one place in the code for each of its edges.
//!
//! What names an item: `use` trees, paths in the code, and paths in attributes and macro
//! arguments (clap's `value_parser = super::x::f`, `format!` arguments), read as tokens.
//! Re-exports and imports are followed to where the item lives, so `super::Thing` names the
//! sibling that defines `Thing` when the parent only re-exports it. Test code
//! (`#[cfg(test)]`) is left out: tests read everything and nothing reads them.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt, fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use petgraph::{algo::tarjan_scc, graph::DiGraph};
use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

use crate::cmd;

/// The crates checked, by their root file relative to the workspace.
const CRATE_ROOTS: [&str; 5] = [
    "tracer/src/main.rs",
    "tracer-common/src/lib.rs",
    "tracer-ebpf/src/main.rs",
    "cupti-inject/src/lib.rs",
    "xtask/src/main.rs",
];

/// Checks every crate; an error lists each circle found.
pub fn check_imports() -> Result<()> {
    let root = cmd::workspace_root();
    let mut circles = Vec::new();
    let mut modules = 0;
    for crate_root in CRATE_ROOTS {
        let tree = ModuleTree::read(&root, Path::new(crate_root))?;
        modules += tree.files.len();
        circles.extend(
            tree.circles()
                .into_iter()
                .map(|circle| (crate_root, circle)),
        );
    }
    if circles.is_empty() {
        eprintln!(
            "xtask: check-imports: {} crates, {modules} modules, no import circles",
            CRATE_ROOTS.len()
        );
        return Ok(());
    }
    for (crate_root, circle) in &circles {
        eprintln!("{crate_root}: {circle}");
    }
    bail!(
        "{} import circle(s): a module may not depend, directly or through others, on a \
         sibling that depends on it",
        circles.len()
    )
}

type ModPath = Vec<String>;

/// A crate's modules, what each binds by `use`, and what each names.
struct ModuleTree {
    /// Every module, with the file that holds it.
    files: BTreeMap<ModPath, PathBuf>,
    /// Per module, the names its `use` items bind, to the absolute path they stand for.
    bindings: HashMap<ModPath, HashMap<String, ModPath>>,
    /// Per module, the absolute paths it names, with the line of the first mention.
    references: BTreeMap<ModPath, BTreeMap<ModPath, usize>>,
}

/// One circle among the children of `parent`: its members and each edge's first place.
#[derive(Debug, PartialEq)]
pub struct Circle {
    parent: ModPath,
    members: Vec<String>,
    edges: Vec<(String, String, String)>,
}

impl fmt::Display for Circle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parent = if self.parent.is_empty() {
            "crate".to_string()
        } else {
            self.parent.join("::")
        };
        writeln!(f, "circle in {parent}: {}", self.members.join(" ↔ "))?;
        for (from, to, place) in &self.edges {
            writeln!(f, "    {from} → {to}  ({place})")?;
        }
        Ok(())
    }
}

impl ModuleTree {
    /// Reads the crate whose root file is `root_file`, relative to `workspace`; places in
    /// messages are relative to `workspace` too.
    fn read(workspace: &Path, root_file: &Path) -> Result<Self> {
        let mut tree = ModuleTree {
            files: BTreeMap::new(),
            bindings: HashMap::new(),
            references: BTreeMap::new(),
        };
        let mut parsed = Vec::new();
        let mut pending = vec![(Vec::new(), root_file.to_path_buf(), true)];
        while let Some((path, file, owns_dir)) = pending.pop() {
            let text = fs::read_to_string(workspace.join(&file))
                .with_context(|| format!("reading {}", file.display()))?;
            let syntax =
                syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))?;
            let dir = if owns_dir {
                file.parent().unwrap().to_path_buf()
            } else {
                file.with_extension("")
            };
            for name in child_modules(&syntax.items) {
                let child_file = [
                    dir.join(format!("{name}.rs")),
                    dir.join(&name).join("mod.rs"),
                ]
                .into_iter()
                .find(|candidate| workspace.join(candidate).is_file())
                .with_context(|| format!("{}: no file for `mod {name};`", file.display()))?;
                let owns = child_file.ends_with("mod.rs");
                let mut child = path.clone();
                child.push(name);
                pending.push((child, child_file, owns));
            }
            tree.files.insert(path.clone(), file.clone());
            parsed.push((path, syntax));
        }
        for (path, syntax) in &parsed {
            let mut collector = Collector::new(&tree, path);
            collector.visit_file(syntax);
            tree.bindings.insert(path.clone(), collector.bindings);
        }
        // References resolve through every module's bindings, so they come second.
        for (path, syntax) in &parsed {
            let mut collector = Collector::new(&tree, path);
            collector.bindings = tree.bindings[path].clone();
            collector.visit_file(syntax);
            let mut named = BTreeMap::new();
            for (absolute, line) in collector.named {
                if let Some(target) = tree.resolve(absolute) {
                    named.entry(target).or_insert(line);
                }
            }
            tree.references.insert(path.clone(), named);
        }
        Ok(tree)
    }

    fn is_module(&self, path: &[String]) -> bool {
        self.files.contains_key(path)
    }

    /// The module an absolute path names an item of, following imports and re-exports.
    fn resolve(&self, mut path: ModPath) -> Option<ModPath> {
        for _ in 0..16 {
            let mut depth = 0;
            while depth < path.len() && self.is_module(&path[..=depth]) {
                depth += 1;
            }
            let module = &path[..depth];
            let Some(next) = path.get(depth) else {
                return Some(module.to_vec());
            };
            match self.bindings.get(module).and_then(|names| names.get(next)) {
                Some(target) if target.as_slice() != &path[..=depth] => {
                    let mut followed = target.clone();
                    followed.extend_from_slice(&path[depth + 1..]);
                    path = followed;
                }
                _ => return Some(module.to_vec()),
            }
        }
        None
    }

    /// Every circle among siblings, in a stable order.
    fn circles(&self) -> Vec<Circle> {
        // (parent, from child, to child) → the first place that makes the edge.
        let mut edges: BTreeMap<(ModPath, String, String), String> = BTreeMap::new();
        for (from, named) in &self.references {
            for (to, line) in named {
                let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
                if common == from.len() || common == to.len() {
                    continue; // an ancestor or a descendant
                }
                let key = (
                    from[..common].to_vec(),
                    from[common].clone(),
                    to[common].clone(),
                );
                edges.entry(key).or_insert_with(|| {
                    format!(
                        "{}:{line} names {}",
                        self.files[from].display(),
                        to.join("::")
                    )
                });
            }
        }
        let parents: BTreeSet<&ModPath> = edges.keys().map(|(parent, _, _)| parent).collect();
        let mut circles = Vec::new();
        for parent in parents {
            let mut graph = DiGraph::<&str, ()>::new();
            let mut nodes = HashMap::new();
            let in_parent = edges.keys().filter(|(p, _, _)| p == parent);
            for (_, from, to) in in_parent.clone() {
                for name in [from, to] {
                    nodes
                        .entry(name.as_str())
                        .or_insert_with(|| graph.add_node(name.as_str()));
                }
                graph.add_edge(nodes[from.as_str()], nodes[to.as_str()], ());
            }
            for component in tarjan_scc(&graph) {
                if component.len() < 2 {
                    continue;
                }
                let mut members: Vec<String> =
                    component.iter().map(|&n| graph[n].to_string()).collect();
                members.sort();
                let edges = in_parent
                    .clone()
                    .filter(|(_, from, to)| members.contains(from) && members.contains(to))
                    .map(|key| (key.1.clone(), key.2.clone(), edges[key].clone()))
                    .collect();
                circles.push(Circle {
                    parent: parent.clone(),
                    members,
                    edges,
                });
            }
        }
        circles
    }
}

/// The `mod name;` items of a file (not inline ones, not test-only ones).
fn child_modules(items: &[syn::Item]) -> Vec<String> {
    items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Mod(module) if module.content.is_none() && !is_test_only(&module.attrs) => {
                Some(module.ident.to_string())
            }
            _ => None,
        })
        .collect()
}

/// `#[cfg(test)]`, alone or inside `all(...)`.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr.meta.require_list().is_ok_and(|list| {
                list.tokens
                    .clone()
                    .into_iter()
                    .any(|t| is_ident(&t, "test"))
            })
    })
}

fn is_ident(token: &TokenTree, name: &str) -> bool {
    matches!(token, TokenTree::Ident(ident) if ident == name)
}

/// Walks one module's file: the names its `use` items bind, and the paths it names.
struct Collector<'a> {
    tree: &'a ModuleTree,
    module: ModPath,
    bindings: HashMap<String, ModPath>,
    named: Vec<(ModPath, usize)>,
}

impl<'a> Collector<'a> {
    fn new(tree: &'a ModuleTree, module: &ModPath) -> Self {
        Collector {
            tree,
            module: module.clone(),
            bindings: HashMap::new(),
            named: Vec::new(),
        }
    }

    /// A path as written here, made absolute; `None` for other crates and local names.
    fn absolute(&self, segments: &[String]) -> Option<ModPath> {
        let (first, rest) = segments.split_first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.module.clone(),
            "super" => {
                let mut base = self.module.clone();
                base.pop()?;
                let mut rest = rest;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
                base.extend_from_slice(rest);
                return Some(base);
            }
            name => {
                let mut child = self.module.clone();
                child.push(name.to_string());
                if self.tree.is_module(&child) {
                    child
                } else if let Some(bound) = self.bindings.get(name) {
                    bound.clone()
                } else {
                    return None;
                }
            }
        };
        base.extend_from_slice(rest);
        Some(base)
    }

    fn name(&mut self, segments: &[String], line: usize) {
        if let Some(absolute) = self.absolute(segments) {
            self.named.push((absolute, line));
        }
    }

    /// A `use` tree: each leaf binds a name and is named.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => self.use_leaf(prefix, &name.ident, &name.ident),
            syn::UseTree::Rename(rename) => self.use_leaf(prefix, &rename.ident, &rename.rename),
            syn::UseTree::Glob(glob) => {
                let line = glob.star_token.span.start().line;
                let prefix = prefix.clone();
                self.name(&prefix, line);
            }
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    fn use_leaf(&mut self, prefix: &[String], ident: &syn::Ident, bound_as: &syn::Ident) {
        let mut segments = prefix.to_vec();
        if ident != "self" {
            segments.push(ident.to_string());
        }
        let line = ident.span().start().line;
        if let Some(absolute) = self.absolute(&segments) {
            if bound_as != "_" {
                let name = if bound_as == "self" {
                    prefix.last().cloned().unwrap_or_default()
                } else {
                    bound_as.to_string()
                };
                self.bindings.insert(name, absolute.clone());
            }
            self.named.push((absolute, line));
        }
    }

    /// Paths inside tokens the parser leaves unread: `a::b::c` runs.
    fn tokens(&mut self, tokens: TokenStream) {
        let mut run: Vec<String> = Vec::new();
        let mut line = 0;
        let mut colons = 0;
        let flush = |this: &mut Self, run: &mut Vec<String>, line: usize| {
            if run.len() > 1 {
                this.name(run, line);
            }
            run.clear();
        };
        for token in tokens {
            match &token {
                TokenTree::Ident(ident) => {
                    if colons != 2 {
                        flush(self, &mut run, line);
                        line = ident.span().start().line;
                    }
                    run.push(ident.to_string());
                    colons = 0;
                }
                TokenTree::Punct(punct) if punct.as_char() == ':' && !run.is_empty() => {
                    colons += 1;
                }
                TokenTree::Group(group) => {
                    flush(self, &mut run, line);
                    colons = 0;
                    self.tokens(group.stream());
                }
                // serde's `with = "crate::x"` and the like name a path in a string.
                TokenTree::Literal(literal) => {
                    flush(self, &mut run, line);
                    colons = 0;
                    if let Ok(syn::Lit::Str(text)) = syn::parse2::<syn::Lit>(token.clone().into())
                        && let Ok(path) = text.parse::<syn::Path>()
                    {
                        let segments: Vec<String> =
                            path.segments.iter().map(|s| s.ident.to_string()).collect();
                        if segments.len() > 1 {
                            self.name(&segments, literal.span().start().line);
                        }
                    }
                }
                _ => {
                    flush(self, &mut run, line);
                    colons = 0;
                }
            }
        }
        flush(self, &mut run, line);
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(module) => &module.attrs,
            syn::Item::Fn(function) => &function.attrs,
            syn::Item::Impl(block) => &block.attrs,
            syn::Item::Use(item_use) => &item_use.attrs,
            syn::Item::Const(constant) => &constant.attrs,
            syn::Item::Static(item_static) => &item_static.attrs,
            syn::Item::Struct(item_struct) => &item_struct.attrs,
            syn::Item::Enum(item_enum) => &item_enum.attrs,
            syn::Item::Macro(item_macro) => &item_macro.attrs,
            syn::Item::Trait(item_trait) => &item_trait.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if is_test_only(attrs) {
            return;
        }
        // A `mod x;` is declared, not used; an inline module is part of this file.
        if let syn::Item::Mod(module) = item
            && module.content.is_none()
        {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_item_use(&mut self, item_use: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item_use.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1
            || segments
                .first()
                .is_some_and(|s| self.bindings.contains_key(s))
        {
            let line = path.segments[0].ident.span().start().line;
            self.name(&segments, line);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        if let syn::Meta::List(list) = &attr.meta {
            self.tokens(list.tokens.clone());
        } else if let syn::Meta::NameValue(name_value) = &attr.meta
            && !attr.path().is_ident("doc")
        {
            self.visit_expr(&name_value.value);
        }
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.tokens(mac.tokens.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a crate of `(file, text)` into a fresh folder and reads its circles.
    fn circles_of(files: &[(&str, &str)]) -> Vec<String> {
        let dir = std::env::temp_dir().join(format!(
            "xtask-imports-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&dir);
        for (name, text) in files {
            let path = dir.join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
        let tree = ModuleTree::read(&dir, Path::new("lib.rs")).unwrap();
        let circles = tree.circles().iter().map(|c| c.to_string()).collect();
        fs::remove_dir_all(&dir).unwrap();
        circles
    }

    fn members(circles: &[String]) -> Vec<String> {
        circles
            .iter()
            .map(|c| c.lines().next().unwrap().to_string())
            .collect()
    }

    #[test]
    fn a_one_way_chain_has_no_circle() {
        let circles = circles_of(&[
            ("lib.rs", "mod a; mod b; mod c;"),
            ("a.rs", "use crate::b::B; pub struct A(B);"),
            ("b.rs", "pub struct B(crate::c::C);"),
            ("c.rs", "pub struct C;"),
        ]);
        assert_eq!(circles, Vec::<String>::new());
    }

    #[test]
    fn a_circle_through_three_files_is_named_with_its_places() {
        let circles = circles_of(&[
            ("lib.rs", "mod a; mod b; mod c;"),
            ("a.rs", "use crate::b::B;\npub struct A(B);"),
            ("b.rs", "pub struct B(crate::c::C);"),
            ("c.rs", "pub struct C;\nfn f() { let _ = super::a::A; }"),
        ]);
        assert_eq!(circles.len(), 1);
        let text = &circles[0];
        assert!(text.starts_with("circle in crate: a ↔ b ↔ c\n"), "{text}");
        assert!(text.contains("c → a  ("), "{text}");
        assert!(text.contains("c.rs:2 names a)"), "{text}");
        assert!(text.contains("a.rs:1 names b)"), "{text}");
    }

    #[test]
    fn parents_and_children_are_not_circles_but_siblings_in_a_folder_are() {
        let circles = circles_of(&[
            ("lib.rs", "mod run; pub struct Top;"),
            ("run/mod.rs", "mod x; mod y; use x::X; fn f(_: X) {}"),
            ("run/x.rs", "pub struct X(crate::Top, super::y::Y);"),
            (
                "run/y.rs",
                "pub struct Y; fn g() { let _ = super::X::default; }",
            ),
        ]);
        // y names X through the parent's import: the edge is y → x.
        assert_eq!(members(&circles), ["circle in run: x ↔ y"]);
    }

    #[test]
    fn folders_meet_as_wholes_at_their_common_parent() {
        let circles = circles_of(&[
            ("lib.rs", "mod probes; mod stacks;"),
            ("probes/mod.rs", "mod attach; pub use attach::Plan;"),
            ("probes/attach.rs", "pub struct Plan(crate::stacks::Maps);"),
            ("stacks/mod.rs", "mod maps; pub use self::maps::Maps;"),
            (
                "stacks/maps.rs",
                "pub struct Maps; fn f(_: crate::probes::Plan) {}",
            ),
        ]);
        assert_eq!(members(&circles), ["circle in crate: probes ↔ stacks"]);
    }

    #[test]
    fn attributes_and_macros_are_read_and_tests_are_not() {
        let circles = circles_of(&[
            ("lib.rs", "mod args; mod window;"),
            (
                "args.rs",
                "#[arg(value_parser = super::window::parse)]\npub struct Args;",
            ),
            (
                "window.rs",
                "pub fn parse() {}\n#[cfg(test)]\nmod tests { use crate::args::Args; }",
            ),
        ]);
        assert_eq!(circles, Vec::<String>::new());
        let circles = circles_of(&[
            ("lib.rs", "mod args; mod window;"),
            (
                "args.rs",
                "#[arg(value_parser = super::window::parse)]\npub struct Args;",
            ),
            (
                "window.rs",
                "pub fn parse() { println!(\"{:?}\", crate::args::Args); }",
            ),
        ]);
        assert_eq!(members(&circles), ["circle in crate: args ↔ window"]);
    }

    #[test]
    fn the_workspace_reads() {
        let root = cmd::workspace_root();
        for crate_root in CRATE_ROOTS {
            let tree = ModuleTree::read(&root, Path::new(crate_root)).unwrap();
            assert!(tree.files.len() > 1, "{crate_root}");
        }
    }
}
