//! The initramfs: an uncompressed newc cpio archive of busybox, the modules and the scripts.

use std::fs;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

use super::boot::Machine;
use super::guest::init_script;

struct Cpio<W: Write> {
    out: W,
    ino: u32,
}

impl<W: Write> Cpio<W> {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8], rdev: (u32, u32)) -> Result<()> {
        self.ino += 1;
        let mut writer = cpio::newc::Builder::new(name)
            .ino(self.ino)
            .mode(mode)
            .nlink(if mode & 0o170000 == 0o040000 { 2 } else { 1 })
            .rdev_major(rdev.0)
            .rdev_minor(rdev.1)
            .write(&mut self.out, u32::try_from(data.len())?);
        writer.write_all(data)?;
        writer.finish()?;
        Ok(())
    }

    fn dir(&mut self, name: &str) -> Result<()> {
        self.entry(name, 0o040755, &[], (0, 0))
    }

    fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> Result<()> {
        self.entry(name, 0o100000 | mode, data, (0, 0))
    }

    fn finish(mut self) -> Result<W> {
        cpio::newc::trailer(&mut self.out)?;
        Ok(self.out)
    }
}

pub(super) fn write_initramfs(
    path: &Path,
    machine: &Machine<'_>,
    modules: &[(String, Vec<u8>)],
    script: &str,
) -> Result<()> {
    let busybox = fs::read(&machine.busybox)
        .with_context(|| format!("reading {}", machine.busybox.display()))?;
    let file = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut cpio = Cpio {
        out: std::io::BufWriter::new(file),
        ino: 0,
    };
    for dir in ["bin", "dev", "proc", "sys", "lib", "lib/modules"] {
        cpio.dir(dir)?;
    }
    // The kernel opens /dev/console for init before devtmpfs is mounted.
    cpio.entry("dev/console", 0o020600, &[], (5, 1))?;
    cpio.file("bin/busybox", 0o755, &busybox)?;
    for (name, ko) in modules {
        cpio.file(&format!("lib/modules/{name}.ko"), 0o644, ko)?;
    }
    let names: Vec<String> = modules.iter().map(|(n, _)| n.clone()).collect();
    let init = init_script(machine.arch, &names, &machine.shares);
    cpio.file("init", 0o755, init.as_bytes())?;
    cpio.file("vm-test.sh", 0o644, script.as_bytes())?;
    cpio.finish()?.flush()?;
    Ok(())
}
