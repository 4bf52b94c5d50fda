//! Who may trace, and who the traced command runs as.

use std::{
    ffi::{CStr, CString, OsString},
    fs,
    os::unix::ffi::OsStringExt,
};

/// Capability numbers (linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

#[derive(Debug, thiserror::Error)]
#[error(
    "cudatrace needs root, or CAP_BPF and CAP_PERFMON, to load eBPF probes: \
     run it with sudo (the command still runs as you)"
)]
pub struct NotPrivileged;

/// The effective capability mask of this process (`CapEff` in /proc/self/status).
fn effective_caps() -> u64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Root, or CAP_BPF + CAP_PERFMON (CAP_SYS_ADMIN covers both on older kernels).
pub fn check() -> Result<(), NotPrivileged> {
    let caps = effective_caps();
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root || has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        Ok(())
    } else {
        Err(NotPrivileged)
    }
}

/// The unprivileged user to run the command as, and to own the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetUser {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub name: String,
    pub home: Option<OsString>,
}

/// The user who invoked sudo, from `SUDO_UID`/`SUDO_GID`, with their groups and home.
/// None when not under sudo, or when sudo was run by root itself.
pub fn sudo_user() -> Option<TargetUser> {
    let uid: u32 = std::env::var("SUDO_UID").ok()?.parse().ok()?;
    let gid: u32 = std::env::var("SUDO_GID").ok()?.parse().ok()?;
    if uid == 0 {
        return None;
    }
    let (name, home) = passwd_entry(uid).unwrap_or_else(|| {
        (
            std::env::var("SUDO_USER").unwrap_or_else(|_| uid.to_string()),
            None,
        )
    });
    let groups = group_list(&name, gid);
    Some(TargetUser {
        uid,
        gid,
        groups,
        name,
        home,
    })
}

fn passwd_entry(uid: u32) -> Option<(String, Option<OsString>)> {
    let mut buffer = vec![0 as libc::c_char; 16 * 1024];
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result = std::ptr::null_mut();
    // SAFETY: getpwuid_r writes into the provided buffer and entry.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return None;
    }
    // SAFETY: on success the fields point into `buffer`, NUL-terminated.
    let name = unsafe { CStr::from_ptr(entry.pw_name) }
        .to_string_lossy()
        .into_owned();
    let home = unsafe { CStr::from_ptr(entry.pw_dir) }.to_bytes().to_vec();
    Some((name, (!home.is_empty()).then(|| OsString::from_vec(home))))
}

fn group_list(name: &str, gid: u32) -> Vec<u32> {
    let Ok(c_name) = CString::new(name) else {
        return vec![gid];
    };
    let mut groups = vec![0 as libc::gid_t; 256];
    let mut count = groups.len() as libc::c_int;
    // SAFETY: getgrouplist fills at most `count` entries and updates `count`.
    let rc = unsafe { libc::getgrouplist(c_name.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
    if rc < 0 {
        return vec![gid];
    }
    groups.truncate(count.max(0) as usize);
    groups
}

/// Becomes `user` for good (groups, gid, uid), for commands that need no privilege and
/// should have none of root's (`view`: it reads the trace as the user who asked).
pub fn become_user(user: &TargetUser) -> std::io::Result<()> {
    // SAFETY: setgroups/setgid/setuid(2) with a valid array; groups and gid go first,
    // while still root.
    let failed = unsafe {
        libc::setgroups(user.groups.len(), user.groups.as_ptr()) != 0
            || libc::setgid(user.gid) != 0
            || libc::setuid(user.uid) != 0
    };
    match failed {
        true => Err(std::io::Error::last_os_error()),
        false => Ok(()),
    }
}

/// The environment for the command: ours, with HOME/USER/LOGNAME of the target user.
pub fn command_env(user: Option<&TargetUser>) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    if let Some(user) = user {
        let mut set = |key: &str, value: OsString| {
            env.retain(|(k, _)| k != key);
            env.push((key.into(), value));
        };
        if let Some(home) = &user.home {
            set("HOME", home.clone());
        }
        set("USER", user.name.clone().into());
        set("LOGNAME", user.name.clone().into());
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_env_switches_identity_variables() {
        let user = TargetUser {
            uid: 1000,
            gid: 1000,
            groups: vec![1000],
            name: "alice".into(),
            home: Some("/home/alice".into()),
        };
        let env = command_env(Some(&user));
        let get = |key: &str| env.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        assert_eq!(get("HOME"), Some("/home/alice".into()));
        assert_eq!(get("USER"), Some("alice".into()));
        assert_eq!(get("LOGNAME"), Some("alice".into()));
        assert_eq!(env.iter().filter(|(k, _)| k == "HOME").count(), 1);
    }
}
