//! memhook-tests: cross-crate integration tests, the models they check the
//! implementation against, and the harnesses shared with the fuzz targets.
pub mod cc;
pub mod elf_fuzz;
pub mod fakecuda;
pub mod libmemhook;
pub mod maps_model;
pub mod memtype_model;
pub mod reloc_check;
pub mod reloc_check_aarch64;
