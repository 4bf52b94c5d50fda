//! The test binaries the guest runs, and the guest's scripts (its init and its test run).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, Result, ensure};

use crate::cmd::{self};

use super::{Arch, EXIT_MARK, ROOT_TAG, SKIPPED, Share, TestBinary, VmTestOptions};

/// Builds the test targets for `arch` and returns the executables of `names` (cudatrace's),
/// in that order. On the host's architecture the whole workspace's tests are built, as
/// `cargo test --workspace` builds them: the same packages give the same features, so what
/// `cargo xtask test` built just before is reused (`-p cudatrace` alone unifies features
/// differently and rebuilt every shared dependency: 94 s of CI). For arm64 only `names` are
/// built, cross-compiled with Debian's aarch64-linux-gnu-gcc as linker (the C the tests
/// build, they build in the guest with its own gcc).
pub(super) fn build_tests(root: &Path, arch: Arch, names: &[&str]) -> Result<Vec<TestBinary>> {
    let mut command = cmd::cargo();
    command.args(["test", "--no-run", "--locked"]);
    match arch.rust_target() {
        None => {
            command.args(["--workspace", "--tests"]);
        }
        Some(target) => {
            command.args(["-p", "cudatrace", "--target", target]);
            for name in names {
                command.args(["--test", name]);
            }
            for (var, value) in crate::arm64::cross_env() {
                command.env(var, value);
            }
        }
    }
    eprintln!(
        "xtask: vm-test: cargo test --no-run {}",
        arch.rust_target()
            .map(|t| format!("-p cudatrace --target {t}"))
            .unwrap_or_else(|| "--workspace --tests".to_owned())
    );
    // Cargo gives manifests' paths with symlinks resolved.
    let cudatrace_manifest = root
        .join("tracer/Cargo.toml")
        .canonicalize()
        .context("tracer/Cargo.toml")?;
    let mut child = command
        .arg("--message-format=json-render-diagnostics")
        .current_dir(root)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting cargo test --no-run")?;
    let mut found: HashMap<String, TestBinary> = HashMap::new();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let message: serde_json::Value = match serde_json::from_str(&line?) {
            Ok(v) => v,
            Err(_) => continue,
        };
        let target = &message["target"];
        let (Some(name), Some(exe), Some(manifest)) = (
            target["name"].as_str(),
            message["executable"].as_str(),
            message["manifest_path"].as_str(),
        ) else {
            continue;
        };
        let is_test = target["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "test"));
        if is_test && names.contains(&name) && Path::new(manifest) == cudatrace_manifest {
            found.insert(
                name.to_owned(),
                TestBinary {
                    name: name.to_owned(),
                    exe: exe.into(),
                    cwd: Path::new(manifest)
                        .parent()
                        .context("manifest path")?
                        .into(),
                    filters: Vec::new(),
                },
            );
        }
    }
    let status = child.wait()?;
    ensure!(status.success(), "cargo test --no-run failed ({status})");
    let mut tests = Vec::new();
    for name in names {
        match found.remove(*name) {
            Some(test) => tests.push(test),
            None => eprintln!("xtask: vm-test: no test target {name} in cudatrace: skipped"),
        }
    }
    Ok(tests)
}

/// Single-quotes `s` for sh.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// What the guest runs in its new root (the host's files, writes in memory). Its output goes
/// to the results port; the exit status is the number of failed test binaries.
pub(super) fn guest_script(root: &Path, tests: &[TestBinary], opts: &VmTestOptions) -> String {
    let mut s = String::from(
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         export HOME=/root RUST_BACKTRACE=1 LANG=C.UTF-8\n\
         # --report-time is unstable in libtest: RUSTC_BOOTSTRAP lets a stable build print it.\n\
         export RUSTC_BOOTSTRAP=1\n\
         echo \"vm-test: guest $(uname -r) up after $(cut -d' ' -f1 /proc/uptime) s, $(nproc) cpus\"\n\
         failed=0\n",
    );
    if let Some(command) = &opts.exec {
        let _ = writeln!(
            s,
            "cd {} && sh -c {} || failed=$?",
            quote(&root.to_string_lossy()),
            quote(command)
        );
    }
    // What this kernel allows, for the README's table (`support.rs`): the cudatrace built
    // beside the test binaries (`<target>/[<triple>/]debug/cudatrace`), of the guest's arch.
    let cudatrace = tests.first().and_then(|t| {
        t.exe
            .parent()?
            .parent()
            .map(|debug| debug.join("cudatrace"))
    });
    if let (None, Some(cudatrace)) = (&opts.exec, cudatrace) {
        let _ = writeln!(
            s,
            "echo \"{}$({} doctor --json 2>/dev/null | tr -d '\\n')\"",
            super::support::DOCTOR_MARK,
            quote(&cudatrace.to_string_lossy())
        );
    }
    let mut skip = String::new();
    for (name, _) in SKIPPED.iter().filter(|_| !opts.no_skip) {
        let _ = write!(skip, " --skip {}", quote(name));
    }
    for test in tests.iter().filter(|_| opts.exec.is_none()) {
        // --filter replaces the kernel's subset of the binary's tests.
        let filter = match &opts.filter {
            Some(filter) => quote(filter),
            None => test
                .filters
                .iter()
                .map(|f| quote(f))
                .collect::<Vec<_>>()
                .join(" "),
        } + &skip;
        let _ = write!(
            s,
            "echo \"vm-test: === {name}\"\n\
             t0=$(cut -d' ' -f1 /proc/uptime)\n\
             (cd {cwd} && {exe} --test-threads=1 --color never -Z unstable-options --report-time {filter}) \
             || failed=$((failed + 1))\n\
             echo \"vm-test: === {name} took $(awk -v t0=$t0 '{{print $1 - t0}}' /proc/uptime) s\"\n",
            name = test.name,
            cwd = quote(&test.cwd.to_string_lossy()),
            exe = quote(&test.exe.to_string_lossy()),
        );
    }
    s.push_str("exit $failed\n");
    s
}

/// The guest's /init: modules, the read-only shared root under an overlay (and the other
/// shares at their places in it: under an overlay too, or written through), the kernel's
/// filesystems, then the test script chrooted into it.
pub(super) fn init_script(arch: Arch, modules: &[String], shares: &[Share]) -> String {
    let mut more_mounts = String::new();
    for (index, share) in shares.iter().filter(|s| s.tag != ROOT_TAG).enumerate() {
        let (tag, at) = (share.tag, quote(&format!("/newroot{}", share.at.display())));
        if share.writable {
            let _ = writeln!(
                more_mounts,
                "mkdir -p {at} && mount -t virtiofs {tag} {at} || die \"mount virtiofs {tag}\""
            );
        } else {
            let _ = write!(
                more_mounts,
                "mkdir -p /lower{index} /rw/upper{index} /rw/work{index} {at}\n\
                 mount -t virtiofs -o ro {tag} /lower{index} || die \"mount virtiofs {tag}\"\n\
                 mount -t overlay overlay -o lowerdir=/lower{index},upperdir=/rw/upper{index},\
                 workdir=/rw/work{index} {at} || die \"mount overlay at {at}\"\n",
            );
        }
    }
    let results = format!("/dev/{}1", arch.serial());
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# The results port: raw, so the output arrives as written.
stty -F {results} raw -echo 2>/dev/null
exec 3>{results}
die() {{ echo "vm-test: guest setup failed: $*" >&3; echo "{mark} 125" >&3; poweroff -f; }}
for m in {modules}; do insmod /lib/modules/$m.ko || die "insmod $m"; done
mkdir -p /lower /rw /newroot
mount -t virtiofs -o ro {tag} /lower || die "mount virtiofs {tag}"
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot \
    || die "mount overlay"
{more_mounts}mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs tmpfs /newroot/dev/shm
mount -t tracefs tracefs /newroot/sys/kernel/tracing || die "mount tracefs"
mount -t debugfs debugfs /newroot/sys/kernel/debug
mount -t bpf bpf /newroot/sys/fs/bpf
# /tmp and the rest stay the host's, writable through the overlay: a checkout under /tmp works.
cp /vm-test.sh /newroot/.cudatrace-vm-test.sh
setsid chroot /newroot /bin/sh /.cudatrace-vm-test.sh >&3 2>&1
echo "{mark} $?" >&3
poweroff -f
"#,
        mark = EXIT_MARK,
        tag = ROOT_TAG,
        modules = modules.join(" "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binarys_subset_becomes_its_filters_unless_filter_replaces_it() {
        let test = TestBinary {
            name: "stacks".into(),
            exe: "/t/stacks-1".into(),
            cwd: "/w/tracer".into(),
            filters: vec!["every_stack", "launches_probed"],
        };
        let script = guest_script(
            Path::new("/w"),
            std::slice::from_ref(&test),
            &VmTestOptions::default(),
        );
        assert!(
            script.contains(
                "'/t/stacks-1' --test-threads=1 --color never -Z unstable-options \
                             --report-time 'every_stack' 'launches_probed')"
            ),
            "{script}"
        );
        let opts = VmTestOptions {
            filter: Some("dash_p".into()),
            ..VmTestOptions::default()
        };
        let script = guest_script(Path::new("/w"), &[test], &opts);
        assert!(script.contains("--report-time 'dash_p')"), "{script}");
    }

    #[test]
    fn quote_survives_single_quotes() {
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
