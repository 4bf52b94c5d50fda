//! The injection library's name in the processes it goes into: an anonymous file named by
//! its contents' hash (`/proc/PID/maps` shows `/memfd:libcudatrace_inject-HASH.so
//! (deleted)`), so that a later attach finds the library an earlier one loaded, and another
//! build's library is never taken for it.

/// The name: the contents' FNV-1a hash.
pub fn file_name(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("libcudatrace_inject-{hash:016x}.so")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_is_the_contents_hash() {
        assert_eq!(file_name(b""), "libcudatrace_inject-cbf29ce484222325.so");
        assert_eq!(file_name(b"a"), "libcudatrace_inject-af63dc4c8601ec8c.so");
        assert_ne!(file_name(b"one"), file_name(b"two"));
    }
}
