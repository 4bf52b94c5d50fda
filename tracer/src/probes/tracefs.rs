//! tracefs: where the kernel describes its tracepoints (`events/*/*/format`) and its
//! probe event interfaces.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// Finds tracefs, mounting it at /sys/kernel/tracing if nothing is mounted.
pub fn tracefs() -> Result<PathBuf> {
    for dir in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if Path::new(dir).join("events").is_dir() {
            return Ok(dir.into());
        }
    }
    let target = c"/sys/kernel/tracing";
    // SAFETY: plain mount(2) with static NUL-terminated strings.
    let rc = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "tracefs is not mounted and mounting it at /sys/kernel/tracing failed: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok("/sys/kernel/tracing".into())
}

/// The byte offset of `field` in a tracefs `format` file, if present.
pub fn field_offset(format: &str, field: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let line = line.trim();
        let decl = line.strip_prefix("field:")?.split(';').next()?;
        let name = decl.rsplit([' ', '*']).next()?;
        let name = name.split('[').next()?;
        if name != field {
            return None;
        }
        let offset = line.split("offset:").nth(1)?.split(';').next()?;
        offset.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXIT_FORMAT: &str = "name: sched_process_exit\nID: 369\nformat:\n\
        \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
        \tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
        \tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;\n\
        \tfield:bool group_dead;\toffset:32;\tsize:1;\tsigned:0;\n";

    #[test]
    fn format_files_give_field_offsets() {
        assert_eq!(field_offset(EXIT_FORMAT, "pid"), Some(24));
        assert_eq!(field_offset(EXIT_FORMAT, "comm"), Some(8));
        assert_eq!(field_offset(EXIT_FORMAT, "group_dead"), Some(32));
        assert_eq!(field_offset(EXIT_FORMAT, "prio"), None);
        let exec = "\tfield:__data_loc char[] filename;\toffset:8;\tsize:4;\tsigned:0;\n";
        assert_eq!(field_offset(exec, "filename"), Some(8));
    }
}
