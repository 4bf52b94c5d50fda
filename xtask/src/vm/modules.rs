//! The guest modules (virtio, virtiofs, overlay) and their dependencies, read from the
//! kernel package.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};

/// `wanted` and their dependencies as (name, uncompressed .ko), dependencies first; built-in
/// ones are left out.
pub(super) fn guest_modules(modules: &Path, wanted: &[&str]) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = HashMap::new();
    index_modules(&modules.join("kernel"), &mut files)?;
    let builtin: BTreeSet<String> = fs::read_to_string(modules.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| module_name(Path::new(l)))
        .collect();
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for name in wanted {
        add_module(name, &files, &builtin, &mut seen, &mut order)?;
    }
    Ok(order)
}

fn add_module(
    name: &str,
    files: &HashMap<String, PathBuf>,
    builtin: &BTreeSet<String>,
    seen: &mut BTreeSet<String>,
    order: &mut Vec<(String, Vec<u8>)>,
) -> Result<()> {
    if !seen.insert(name.to_owned()) || builtin.contains(name) {
        return Ok(());
    }
    let path = files
        .get(name)
        .with_context(|| format!("kernel module {name} is neither a file nor built in"))?;
    let ko = read_module(path)?;
    for dep in depends(&ko) {
        add_module(&dep, files, builtin, seen, order)?;
    }
    order.push((name.to_owned(), ko));
    Ok(())
}

/// The module name of `.../name.ko[.xz|.zst|.gz]`, with dashes as underscores.
fn module_name(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    let stem = [".ko", ".ko.xz", ".ko.zst", ".ko.gz"]
        .iter()
        .find_map(|ext| file.strip_suffix(ext))?;
    Some(stem.replace('-', "_"))
}

fn index_modules(dir: &Path, files: &mut HashMap<String, PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            index_modules(&path, files)?;
        } else if let Some(name) = module_name(&path) {
            files.insert(name, path);
        }
    }
    Ok(())
}

/// A module's bytes, decompressed with xz, zstd or gzip where the kernel package compresses
/// them (Debian's 6.1 does not).
fn read_module(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = [(".xz", "xz"), (".zst", "zstd"), (".gz", "gzip")]
        .into_iter()
        .find_map(|(ext, tool)| name.ends_with(ext).then_some(tool));
    let Some(tool) = tool else {
        return fs::read(path).with_context(|| format!("reading {name}"));
    };
    let output = Command::new(tool)
        .arg("-dc")
        .arg(path)
        .output()
        .with_context(|| format!("running {tool} to decompress {name}"))?;
    ensure!(output.status.success(), "{tool} -dc {name} failed");
    Ok(output.stdout)
}

/// The `depends=` entry of a module's `.modinfo` strings.
fn depends(ko: &[u8]) -> Vec<String> {
    const KEY: &[u8] = b"\0depends=";
    let Some(at) = ko.windows(KEY.len()).position(|w| w == KEY) else {
        return Vec::new();
    };
    let value = &ko[at + KEY.len()..];
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end])
        .split(',')
        .filter(|d| !d.is_empty())
        .map(|d| d.replace('-', "_"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depends_reads_the_modinfo_entry() {
        let ko = b"\x7fELF...\0license=GPL\0depends=virtio_ring,virtio-pci-modern-dev\0name=x\0";
        assert_eq!(depends(ko), ["virtio_ring", "virtio_pci_modern_dev"]);
        assert_eq!(depends(b"\0depends=\0"), Vec::<String>::new());
    }
}
