//! Rebuilds core's source tree from the HTML source pages of the rust-docs component.
//!
//! rustdoc renders every source file of `core` it read as one page: a `<meta name="description">`
//! names the file, and the `<pre class="rust"><code>` body is its text with one line-number
//! anchor per line, syntax-highlighting `<span>`s and HTML entities.

use std::fs;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};

const PATH_MARKER: &str = "<meta name=\"description\" content=\"Source of the Rust file `";
const BODY_START: &str = "<pre class=\"rust\"><code>";
const BODY_END: &str = "</code></pre>";
const INCLUDE_MACROS: [&str; 3] = ["include_str!(", "include_bytes!(", "include!("];

/// One source file recovered from its page.
#[derive(Debug)]
pub struct SourceFile {
    /// Relative to the source root, e.g. `library/core/src/bool.rs`.
    pub path: PathBuf,
    pub text: String,
    /// The page's last line number, which the text's line count matched.
    pub lines: usize,
}

pub struct Summary {
    pub files: usize,
    pub lines: usize,
    /// Include targets the pages do not carry (mostly doc `.md` files), written empty.
    pub placeholders: Vec<PathBuf>,
}

/// Writes every page under `pages_dir` as a source file under `out_root`.
pub fn extract(pages_dir: &Path, out_root: &Path) -> Result<Summary> {
    let mut pages = Vec::new();
    collect_pages(pages_dir, &mut pages)?;
    pages.sort();
    ensure!(
        !pages.is_empty(),
        "no source pages in {}",
        pages_dir.display()
    );

    let mut files = Vec::with_capacity(pages.len());
    let mut lines = 0;
    for page in &pages {
        let html =
            fs::read_to_string(page).with_context(|| format!("reading {}", page.display()))?;
        let file = parse_page(&html).with_context(|| format!("parsing {}", page.display()))?;
        let dest = out_root.join(&file.path);
        fs::create_dir_all(dest.parent().expect("a file path"))?;
        fs::write(&dest, &file.text).with_context(|| format!("writing {}", dest.display()))?;
        lines += file.lines;
        files.push(file);
    }

    let mut placeholders = Vec::new();
    for file in &files {
        let dir = file.path.parent().expect("a file path");
        for target in include_targets(&file.text) {
            // A target outside the tree cannot be one of core's own files: leave it to rustc.
            let Some(target) = normalize(&dir.join(target)) else {
                continue;
            };
            let dest = out_root.join(&target);
            if !dest.exists() {
                fs::create_dir_all(dest.parent().expect("a file path"))?;
                fs::write(&dest, "").with_context(|| format!("writing {}", dest.display()))?;
                placeholders.push(target);
            }
        }
    }
    Ok(Summary {
        files: files.len(),
        lines,
        placeholders,
    })
}

fn collect_pages(dir: &Path, pages: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect_pages(&path, pages)?;
        } else if path.extension().is_some_and(|ext| ext == "html") {
            pages.push(path);
        }
    }
    Ok(())
}

/// Recovers one file's path and text from its rustdoc source page.
pub fn parse_page(html: &str) -> Result<SourceFile> {
    let path_start = html
        .find(PATH_MARKER)
        .context("no source-file description")?
        + PATH_MARKER.len();
    let path_len = html[path_start..]
        .find('`')
        .context("unterminated file name")?;
    let raw_path = html_escape::decode_html_entities(&html[path_start..path_start + path_len]);
    let path = normalize(Path::new(raw_path.as_ref()))
        .with_context(|| format!("file name `{raw_path}` leaves the source tree"))?;

    let body_start = html.find(BODY_START).context("no source body")? + BODY_START.len();
    let body_len = html[body_start..]
        .find(BODY_END)
        .context("unterminated source body")?;
    let body = &html[body_start..body_start + body_len];

    let mut text = String::with_capacity(body.len());
    let mut line_anchors = 0;
    let mut rest = body;
    while let Some(tag_start) = rest.find('<') {
        text.push_str(&rest[..tag_start]);
        let tag_len = rest[tag_start..].find('>').context("unterminated tag")? + 1;
        let tag = &rest[tag_start..tag_start + tag_len];
        rest = &rest[tag_start + tag_len..];
        if tag.starts_with("<a ") && tag.contains("data-nosnippet") {
            // A line-number anchor: its text is the number, not source.
            let number_len = rest.find("</a>").context("unterminated line anchor")?;
            let number: usize = rest[..number_len]
                .parse()
                .with_context(|| format!("line anchor `{}`", &rest[..number_len]))?;
            line_anchors += 1;
            ensure!(
                number == line_anchors,
                "line anchor {number} out of sequence"
            );
            rest = &rest[number_len + "</a>".len()..];
        }
    }
    text.push_str(rest);
    // Entities go last: decoded earlier, `&lt;` would read as the start of a tag.
    let text = html_escape::decode_html_entities(&text).into_owned();

    let text_lines = text.lines().count();
    if text_lines != line_anchors {
        bail!("{text_lines} lines of text but {line_anchors} numbered lines");
    }
    Ok(SourceFile {
        path,
        text,
        lines: line_anchors,
    })
}

/// Files that `include_str!`, `include_bytes!` and `include!` outside `//` comments may read.
///
/// A literal argument is the target. A macro argument (`include_str!($doc)` in a `macro_rules!`,
/// as in `ffi/primitives.rs`) cannot be followed, so every file-name-like literal of that source
/// file counts too: a placeholder too many is harmless, one too few fails the build.
fn include_targets(text: &str) -> Vec<&str> {
    let code_lines = || {
        text.lines()
            .filter(|line| !line.trim_start().starts_with("//"))
    };
    let mut targets = Vec::new();
    let mut indirect = false;
    for line in code_lines() {
        for mac in INCLUDE_MACROS {
            let mut rest = line;
            while let Some(at) = rest.find(mac) {
                rest = &rest[at + mac.len()..];
                match string_literal(rest.trim_start()) {
                    Some(target) => targets.push(target),
                    None => indirect = true,
                }
            }
        }
    }
    if indirect {
        for line in code_lines() {
            let mut rest = line;
            while let Some(at) = rest.find('"') {
                rest = &rest[at..];
                let Some(literal) = string_literal(rest) else {
                    break;
                };
                if looks_like_file_name(literal) && !targets.contains(&literal) {
                    targets.push(literal);
                }
                rest = &rest[literal.len() + 2..];
            }
        }
    }
    targets
}

/// The contents of the plain string literal that `code` starts with.
fn string_literal(code: &str) -> Option<&str> {
    let literal = code.strip_prefix('"')?;
    literal.find('"').map(|len| &literal[..len])
}

/// `c_char.md`, `docs/addr.md`; not `1.64.0`, `aarch64` or prose.
fn looks_like_file_name(literal: &str) -> bool {
    let Some((stem, extension)) = literal.rsplit_once('.') else {
        return false;
    };
    !stem.is_empty()
        && stem
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c))
        && extension.starts_with(|c: char| c.is_ascii_alphabetic())
        && extension.chars().all(|c| c.is_ascii_alphanumeric())
}

/// Resolves `.` and `..` lexically; `None` for absolute paths or ones that climb out of the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(path: &str, body: &str) -> String {
        format!(
            "<html><head><meta name=\"description\" content=\"Source of the Rust file `{path}`.\">\
             </head><body><pre class=\"rust\"><code>{body}</code></pre></div></body></html>"
        )
    }

    #[test]
    fn strips_anchors_tags_and_entities() {
        let body = "<a href=#1 id=1 data-nosnippet>1</a><span class=\"kw\">fn </span>f() -&gt; \
                    Vec&lt;u8&gt; { <span class=\"string\">\"a &amp; b\"</span> }\n\
                    <a href=#2 id=2 data-nosnippet>2</a>\n\
                    <a href=#3 id=3 data-nosnippet>3</a><span class=\"comment\">// 10 &lt; 11</span>\n";
        let file = parse_page(&page("library/core/src/../../stdarch/x.rs", body)).unwrap();
        assert_eq!(file.path, Path::new("library/stdarch/x.rs"));
        assert_eq!(file.text, "fn f() -> Vec<u8> { \"a & b\" }\n\n// 10 < 11\n");
        assert_eq!(file.lines, 3);
    }

    #[test]
    fn rejects_a_page_whose_lines_do_not_match_its_numbering() {
        let body = "<a href=#1 id=1 data-nosnippet>1</a>a\nb\n";
        let err = parse_page(&page("library/core/src/a.rs", body)).unwrap_err();
        assert_eq!(err.to_string(), "2 lines of text but 1 numbered lines");
        let body = "<a href=#2 id=2 data-nosnippet>2</a>a\n";
        assert!(parse_page(&page("library/core/src/a.rs", body)).is_err());
    }

    #[test]
    fn rejects_paths_that_leave_the_tree() {
        let body = "<a href=#1 id=1 data-nosnippet>1</a>a\n";
        assert!(parse_page(&page("library/../../etc/passwd", body)).is_err());
        assert!(parse_page(&page("/etc/passwd", body)).is_err());
    }

    #[test]
    fn finds_include_targets_outside_comments() {
        let text = "#[doc = include_str!(\"docs/addr.md\")]\n\
                    /// let s = include_str!(\"spanish.in\");\n\
                    static B: &[u8] = include_bytes!( \"table.bin\" ); include!(\"gen.rs\");\n\
                    include_str!(concat!(\"a\", \"b\"));\n";
        assert_eq!(
            include_targets(text),
            ["docs/addr.md", "table.bin", "gen.rs"]
        );
    }

    #[test]
    fn a_macro_argument_makes_file_name_literals_targets() {
        let text = "macro_rules! alias { ($doc:literal) => { #[doc = include_str!($doc)] } }\n\
                    alias! { \"c_char.md\" } #[stable(since = \"1.64.0\")] #[cfg(x = \"aarch64\")]\n\
                    // alias! { \"commented.md\" }\n";
        assert_eq!(include_targets(text), ["c_char.md"]);
    }
}
