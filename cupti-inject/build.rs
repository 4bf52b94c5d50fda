//! Binds the library's calls to its own functions at link time (`-Bsymbolic-functions`):
//! every batch reaches this file's `cudatrace_gpu_records`, the one cudatrace probes, even
//! if another loaded object exported the same name.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
}
