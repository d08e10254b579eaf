//! Links libmemhook.so with `-z nodelete`: the loader never unloads it.
//!
//! Once installed, memhook's code is reachable from outside it for good:
//! bistro patches jump into its hooks, reloc writes its hooks into other
//! objects' GOT slots (from which a program may have copied a function
//! pointer), and procaddr hands its hooks to the CUDA runtime, which keeps
//! them. A `dlclose` that unmapped the library (a plugin that links
//! `-lmemhook`, unloaded) would leave those jumping into nothing: the next
//! `mmap` of any thread crashed the process (seen with a C program: install,
//! `dlclose`, `mmap`). UCX's UCM pins itself at run time
//! (`ucm_prevent_dl_unload`, a `dlopen` with `RTLD_NODELETE`); a link flag
//! needs no call into the loader. A shared object that contains the static
//! library, or the Rust crate, without the flag is pinned that way by the
//! first install (`memhook::pin`).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
