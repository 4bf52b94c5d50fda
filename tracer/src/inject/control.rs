//! The control file: how cudatrace tells the injection library in each process that another
//! CUPTI client took the activity API or let it go (docs/gpu.md, "Beside another CUPTI
//! client"). One `u32` per pid (the library's `getpid()`), odd while another client holds
//! it; the library maps the file read-only and waits on its slot with a shared futex, which
//! a write here wakes. Written beside the injection library, in the run's private
//! directory (0644: every traced user can read it, only cudatrace can write it); a sparse
//! file, so only the slots of traced pids take memory.

use std::{
    fs::{File, OpenOptions},
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{Context, Result};

/// Its file name in the private directory.
pub const FILE_NAME: &str = "control";

/// The slot's bit that asks a library started late (`-p PID --gpu`) to end its window;
/// the other bits count the other client's takes and releases (odd: held).
pub const DETACH: u32 = 1 << 31;

/// The file, mapped for writing.
#[derive(Debug)]
pub struct ControlFile {
    pub path: PathBuf,
    base: *mut AtomicU32,
    slots: usize,
    /// `-p PID --gpu`: the control file each attached process made for itself (an
    /// anonymous file, so that one in another mount namespace maps it too), mapped here:
    /// pid, address, length. Unmapped when this is dropped.
    late: std::sync::Mutex<Vec<(u32, usize, usize)>>,
}

// SAFETY: the mapping is shared memory written only through atomics.
unsafe impl Send for ControlFile {}
// SAFETY: as above.
unsafe impl Sync for ControlFile {}

impl ControlFile {
    /// Creates the file in `dir` with a slot for every pid up to the kernel's `pid_max`.
    pub fn create(dir: &Path) -> Result<ControlFile> {
        let slots = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|text| text.trim().parse::<usize>().ok())
            .unwrap_or(1 << 22)
            + 1;
        Self::create_with(dir, slots)
    }

    fn create_with(dir: &Path, slots: usize) -> Result<ControlFile> {
        let path = dir.join(FILE_NAME);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let len = slots * size_of::<u32>();
        file.set_len(len as u64)
            .with_context(|| format!("sizing {}", path.display()))?;
        let base = map(&file, len).with_context(|| format!("mapping {}", path.display()))?;
        Ok(ControlFile {
            path,
            base,
            slots,
            late: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// `-p PID --gpu`: process `pid`'s own control file (sized to its slot), which stands
    /// for this file's slot of that pid from now on.
    pub fn add_late(&self, pid: u32, file: &File) -> Result<()> {
        let len = file
            .metadata()
            .context("reading the control file's size")?
            .len() as usize;
        if len < (pid as usize + 1) * size_of::<u32>() {
            anyhow::bail!("the control file of process {pid} has no slot for it ({len} bytes)");
        }
        let base = map(file, len).context("mapping the control file")?;
        let mut late = self.late.lock().unwrap_or_else(|e| e.into_inner());
        late.push((pid, base as usize, len));
        Ok(())
    }

    fn slot(&self, pid: u32) -> Option<&AtomicU32> {
        let late = self.late.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, base, _)) = late.iter().rev().find(|(of, _, _)| *of == pid) {
            // SAFETY: the pid's slot is inside its mapping (checked when added), which
            // lives as long as self.
            return Some(unsafe { &*(base as *mut AtomicU32).add(pid as usize) });
        }
        // SAFETY: inside the mapping, which lives as long as self.
        ((pid as usize) < self.slots).then(|| unsafe { &*self.base.add(pid as usize) })
    }

    /// Says that another CUPTI client of process `pid` holds the activity API (`held`) or
    /// let it go, and wakes the library's flush thread. Returns whether it changed.
    pub fn set(&self, pid: u32, held: bool) -> bool {
        let Some(slot) = self.slot(pid) else {
            return false;
        };
        let value = slot.load(Ordering::Acquire);
        if (value & 1 == 1) == held {
            return false;
        }
        slot.store(
            (value & DETACH) | (value & !DETACH).wrapping_add(1) & !DETACH,
            Ordering::Release,
        );
        wake(slot);
        true
    }

    /// `-p PID --gpu`: asks the library in process `pid` to end its window (the slot's
    /// `DETACH` bit, which stays), and wakes its flush thread.
    pub fn detach(&self, pid: u32) {
        let Some(slot) = self.slot(pid) else {
            return;
        };
        slot.fetch_or(DETACH, Ordering::AcqRel);
        wake(slot);
    }

    /// Whether another client holds the activity API of `pid`, as last said.
    #[cfg(test)]
    pub fn held(&self, pid: u32) -> bool {
        self.slot(pid)
            .is_some_and(|slot| slot.load(Ordering::Acquire) & 1 == 1)
    }
}

/// Wakes the library's flush thread waiting on `slot`.
fn wake(slot: &AtomicU32) {
    // SAFETY: a shared futex wake on the mapped slot; waiters are the libraries' threads
    // waiting on the same file page.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            slot.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0,
        )
    };
}

fn map(file: &File, len: usize) -> std::io::Result<*mut AtomicU32> {
    // SAFETY: a shared read-write mapping of a regular file of `len` bytes.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(base.cast())
}

impl Drop for ControlFile {
    fn drop(&mut self) {
        // SAFETY: unmaps what `map` mapped.
        unsafe { libc::munmap(self.base.cast(), self.slots * size_of::<u32>()) };
        let late = self.late.lock().unwrap_or_else(|e| e.into_inner());
        for &(_, base, len) in late.iter() {
            // SAFETY: as above, for each process's own file.
            unsafe { libc::munmap(base as *mut libc::c_void, len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_flip_between_held_and_free_and_another_mapping_sees_them() {
        let dir = std::env::temp_dir().join(format!("cudatrace-control-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let control = ControlFile::create_with(&dir, 64).unwrap();
        let reader = File::open(&control.path).unwrap();
        // As the library maps it: read-only.
        let view = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                64 * 4,
                libc::PROT_READ,
                libc::MAP_SHARED,
                reader.as_raw_fd(),
                0,
            )
        };
        assert_ne!(view, libc::MAP_FAILED);
        let view = view.cast::<AtomicU32>();
        let read = |pid: usize| unsafe { (*view.add(pid)).load(Ordering::Acquire) };
        assert!(control.set(7, true));
        assert!(!control.set(7, true), "already held");
        assert_eq!((read(7), control.held(7)), (1, true));
        assert!(control.set(7, false));
        assert_eq!((read(7), control.held(7)), (2, false));
        assert!(control.set(7, true));
        assert_eq!(read(7), 3);
        assert_eq!(read(8), 0);
        assert!(!control.set(64, true), "beyond the slots");
        // The window's end: the bit stays across takes and releases.
        control.detach(7);
        assert_eq!(read(7), DETACH | 3);
        assert!(control.set(7, false));
        assert_eq!((read(7), control.held(7)), (DETACH | 4, false));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&control.path)
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o644);
        // A process's own file (`-p PID --gpu`) stands for its slot from then on.
        let own = tempfile_in(&dir, "own", 10 * 4);
        assert!(control.add_late(12, &own).is_err(), "no slot for 12");
        control.add_late(9, &own).unwrap();
        assert!(control.set(9, true));
        control.detach(9);
        let mut word = [0u8; 4];
        use std::os::unix::fs::FileExt;
        own.read_exact_at(&mut word, 9 * 4).unwrap();
        assert_eq!(u32::from_le_bytes(word), DETACH | 1);
        assert_eq!(read(9), 0, "the run's file is left alone");
        drop(control);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_in(dir: &Path, name: &str, len: u64) -> File {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join(name))
            .unwrap();
        file.set_len(len).unwrap();
        file
    }
}
