//! The `LD_PRELOAD` that `memhook run` gives its command: libmemhook.so,
//! after any AddressSanitizer runtime; and whether the command can load
//! it at all (a static program, or one of another class or processor,
//! cannot: the run says so before it starts).
//!
//! ASan's runtime, loaded as a library (GCC's default, `libasan.so.N`;
//! clang's `-shared-libasan`, `libclang_rt.asan*.so`; HWASan's on arm64),
//! checks at start that it is the first library after the program, and
//! ends the process where a preloaded one comes before it ("ASan runtime
//! does not come first in initial library list"). So a runtime the
//! command needs (its `DT_NEEDED` entries) is named first, ahead of
//! libmemhook.so, and one already in `LD_PRELOAD` is kept ahead of it;
//! the loader loads it once. libmemhook.so defines none of the functions
//! a sanitizer intercepts and allocates nothing, so it is safe after the
//! runtime. Only the command itself is read: its children inherit the
//! list as it is, so for an ASan program started by a script the run
//! also turns the check off (`verify_asan_link_order=0` in
//! `ASAN_OPTIONS`, the option ASan has for a library preloaded
//! system-wide), unless the user's options say otherwise.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

use goblin::container::{Container, Ctx, Endian};
use goblin::elf::dynamic::Dynamic;
use goblin::elf::header::{EI_CLASS, EI_DATA, ELFCLASS64, ELFDATA2LSB, Header};
use goblin::elf::program_header::{PT_DYNAMIC, PT_INTERP, PT_LOAD, ProgramHeader};
use goblin::strtab::Strtab;

/// Whether `name` (a path or a file name) is a sanitizer runtime that
/// must be the first library loaded: ASan's or HWASan's shared runtime.
pub fn must_come_first(name: &[u8]) -> bool {
    let base = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
    [
        &b"libasan.so"[..],
        b"libhwasan.so",
        b"libclang_rt.asan",
        b"libclang_rt.hwasan",
    ]
    .iter()
    .any(|p| base.starts_with(p))
        && base.windows(3).any(|w| w == b".so")
}

/// `LD_PRELOAD` for the command: the runtimes that must come first (those
/// in `old`, in its order, then `needed`'s where `old` has none), then
/// `lib`, then the rest of `old`. `old`'s entries are split as the loader
/// splits them, at colons and spaces.
pub fn preload(lib: &Path, old: Option<&OsStr>, needed: &[String]) -> OsString {
    let old: Vec<&[u8]> = old
        .map(|o| o.as_bytes())
        .unwrap_or_default()
        .split(|&b| b == b':' || b == b' ')
        .filter(|e| !e.is_empty())
        .collect();
    let mut first: Vec<&[u8]> = old.iter().copied().filter(|e| must_come_first(e)).collect();
    if first.is_empty() {
        first.extend(needed.iter().map(|n| n.as_bytes()).filter(|n| must_come_first(n)));
    }
    let rest = old.iter().copied().filter(|e| !must_come_first(e));
    let entries: Vec<&[u8]> = first
        .into_iter()
        .chain([lib.as_os_str().as_bytes()])
        .chain(rest)
        .collect();
    OsString::from_vec(entries.join(&b':'))
}

/// `ASAN_OPTIONS` for the run: the user's, with ASan's check of its
/// runtime's place turned off where they do not set it themselves (ASan
/// reads the options in order, separated by colons; the variable is
/// ignored by every program without ASan).
pub fn asan_options(old: Option<&OsStr>) -> OsString {
    const OFF: &[u8] = b"verify_asan_link_order=0";
    let old = old.map(|o| o.as_bytes()).unwrap_or_default();
    if old
        .windows(b"verify_asan_link_order".len())
        .any(|w| w == b"verify_asan_link_order")
    {
        return OsString::from_vec(old.to_vec());
    }
    let mut options = old.to_vec();
    if !options.is_empty() {
        options.push(b':');
    }
    options.extend_from_slice(OFF);
    OsString::from_vec(options)
}

/// The file `command` runs, as `execvp` finds it: itself where it names a
/// path (has a slash), else the first executable file of that name in a
/// `PATH` folder.
pub fn command_file(command: &OsStr) -> Option<PathBuf> {
    if command.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(command));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(command))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// Why the loader would start `path` in secure-execution mode, where it
/// ignores `LD_PRELOAD`'s paths (`ld.so(8)`): set-user-ID to another
/// user, set-group-ID to another group, or (for a user other than root)
/// given file capabilities; `None` otherwise, and on a file system
/// mounted `nosuid`, where the kernel grants none of these.
pub fn secure_execution(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut fs = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and a buffer for the answer.
    if unsafe { libc::statvfs(c_path.as_ptr(), fs.as_mut_ptr()) } == 0
        // SAFETY: filled by statvfs, which succeeded.
        && unsafe { fs.assume_init() }.f_flag & libc::ST_NOSUID != 0
    {
        return None;
    }
    // SAFETY: getuid and getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    if m.mode() & libc::S_ISUID != 0 && m.uid() != uid {
        return Some("set-user-ID to another user");
    }
    if m.mode() & libc::S_ISGID != 0 && m.gid() != gid {
        return Some("set-group-ID to another group");
    }
    // Root has every capability already: a file's gain it nothing, and
    // the loader stays in its usual mode.
    // SAFETY: a NUL-terminated path and name; no buffer (size 0) asks
    // only whether the attribute is there.
    let caps = unsafe {
        libc::getxattr(
            c_path.as_ptr(),
            c"security.capability".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    (uid != 0 && caps > 0).then_some("given file capabilities")
}

/// Largest dynamic section or string table read: far past any real one
/// (a program needing thousands of libraries has a few hundred KiB).
const MAX_TABLE: u64 = 16 << 20;

/// What the command's file is, as far as preloading goes.
#[derive(Debug, PartialEq)]
pub enum Program {
    /// Not an ELF object (a script: the interpreter it names is what runs).
    NotElf,
    /// An ELF object the loader cannot preload this libmemhook.so into:
    /// what it is instead (`"a 32-bit program"`).
    Foreign(&'static str),
    /// No program interpreter: the kernel starts it with no loader, and
    /// `LD_PRELOAD` is not read (a static program, static-pie too).
    Static,
    /// Started by the loader; the libraries its `DT_NEEDED` entries name.
    Dynamic(Vec<String>),
}

/// The machine this libmemhook.so is built for.
#[cfg(target_arch = "x86_64")]
const MACHINE: u16 = goblin::elf::header::EM_X86_64;
#[cfg(target_arch = "aarch64")]
const MACHINE: u16 = goblin::elf::header::EM_AARCH64;

/// Reads what `path` is ([`Program`]). Reads only the ELF header, the
/// program headers, the dynamic section and its string table: a program
/// of gigabytes costs no more than a small one.
pub fn inspect(path: &Path) -> Result<Program, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let read = |offset: u64, len: u64| -> Result<Vec<u8>, String> {
        if len > MAX_TABLE {
            return Err(format!("{}: a table of {len} bytes", path.display()));
        }
        let mut buf = vec![0; len as usize];
        file.read_exact_at(&mut buf, offset)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(buf)
    };
    let ident = match read(0, 64) {
        Ok(b) => b,
        // Shorter than an ELF header: not an object.
        Err(_) => return Ok(Program::NotElf),
    };
    if &ident[..4] != b"\x7fELF" {
        return Ok(Program::NotElf);
    }
    if ident[EI_CLASS] != ELFCLASS64 {
        return Ok(Program::Foreign("a 32-bit program"));
    }
    if ident[EI_DATA] != ELFDATA2LSB {
        return Ok(Program::Foreign("a big-endian program"));
    }
    let malformed = |e: goblin::error::Error| format!("{}: {e}", path.display());
    let header: Header = goblin::elf::Elf::parse_header(&ident).map_err(malformed)?;
    if header.e_machine != MACHINE {
        return Ok(Program::Foreign("a program for another processor"));
    }
    let ctx = Ctx::new(Container::Big, Endian::Little);
    let phdr_bytes = read(
        header.e_phoff,
        u64::from(header.e_phnum) * u64::from(header.e_phentsize),
    )?;
    let phdrs = ProgramHeader::parse(&phdr_bytes, 0, usize::from(header.e_phnum), ctx).map_err(malformed)?;
    if !phdrs.iter().any(|p| p.p_type == PT_INTERP) {
        return Ok(Program::Static);
    }
    let Some(dynamic) = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC) else {
        return Ok(Program::Dynamic(Vec::new()));
    };
    // The dynamic section alone, as the first bytes of a buffer: the
    // loadable segments go with it to turn the string table's address
    // into its offset in the file.
    let dyn_bytes = read(dynamic.p_offset, dynamic.p_filesz)?;
    let mut moved = dynamic.clone();
    moved.p_offset = 0;
    let with_loads: Vec<ProgramHeader> = core::iter::once(moved)
        .chain(phdrs.iter().filter(|p| p.p_type == PT_LOAD).cloned())
        .collect();
    let Some(dynamic) = Dynamic::parse(&dyn_bytes, &with_loads, ctx).map_err(malformed)? else {
        return Ok(Program::Dynamic(Vec::new()));
    };
    if dynamic.info.needed_count == 0 {
        return Ok(Program::Dynamic(Vec::new()));
    }
    let strtab_bytes = read(dynamic.info.strtab as u64, dynamic.info.strsz as u64)?;
    let strtab = Strtab::parse(&strtab_bytes, 0, strtab_bytes.len(), 0).map_err(malformed)?;
    Ok(Program::Dynamic(
        dynamic.get_libraries(&strtab).into_iter().map(String::from).collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(lib: &str, old: Option<&str>, needed: &[&str]) -> String {
        let needed: Vec<String> = needed.iter().map(|s| s.to_string()).collect();
        preload(Path::new(lib), old.map(OsStr::new), &needed)
            .into_string()
            .unwrap()
    }

    #[test]
    fn an_asan_runtime_the_program_needs_comes_first() {
        assert_eq!(joined("/m/libmemhook.so", None, &["libc.so.6"]), "/m/libmemhook.so");
        assert_eq!(
            joined("/m/libmemhook.so", None, &["libasan.so.8", "libc.so.6"]),
            "libasan.so.8:/m/libmemhook.so"
        );
        assert_eq!(
            joined("/m/libmemhook.so", None, &["libclang_rt.asan-x86_64.so"]),
            "libclang_rt.asan-x86_64.so:/m/libmemhook.so"
        );
        // The other sanitizers do not check their place: left out.
        assert_eq!(
            joined(
                "/m/libmemhook.so",
                None,
                &["libtsan.so.2", "libubsan.so.1", "liblsan.so.0"]
            ),
            "/m/libmemhook.so"
        );
    }

    #[test]
    fn the_users_preload_is_kept_after_memhook_but_a_runtime_before() {
        assert_eq!(
            joined("/m/libmemhook.so", Some("/a/libx.so /b/liby.so"), &[]),
            "/m/libmemhook.so:/a/libx.so:/b/liby.so"
        );
        // A runtime the user preloads stays ahead, and the program's own
        // is not named a second time.
        assert_eq!(
            joined(
                "/m/libmemhook.so",
                Some(":/a/libx.so:/usr/lib/libasan.so.8::"),
                &["libasan.so.8"]
            ),
            "/usr/lib/libasan.so.8:/m/libmemhook.so:/a/libx.so"
        );
    }

    #[test]
    fn asan_options_turn_the_place_check_off_unless_the_user_set_it() {
        let options = |old: Option<&str>| asan_options(old.map(OsStr::new)).into_string().unwrap();
        assert_eq!(options(None), "verify_asan_link_order=0");
        assert_eq!(options(Some("")), "verify_asan_link_order=0");
        assert_eq!(
            options(Some("detect_leaks=0")),
            "detect_leaks=0:verify_asan_link_order=0"
        );
        assert_eq!(
            options(Some("verify_asan_link_order=1:halt_on_error=0")),
            "verify_asan_link_order=1:halt_on_error=0"
        );
    }

    #[test]
    fn runtime_names_are_told_by_their_file_name() {
        for yes in [
            &b"libasan.so.6"[..],
            b"/usr/lib/gcc/x86_64-linux-gnu/12/libasan.so",
            b"libhwasan.so.0",
            b"libclang_rt.hwasan-aarch64.so",
        ] {
            assert!(must_come_first(yes), "{}", String::from_utf8_lossy(yes));
        }
        for no in [
            &b"libasan.a"[..],
            b"libclang_rt.asan-x86_64.a",
            b"/opt/libasan.so.8/libfoo.so",
            b"libmemhook.so",
            b"libtsan.so.2",
        ] {
            assert!(!must_come_first(no), "{}", String::from_utf8_lossy(no));
        }
    }

    #[test]
    fn what_a_program_file_is() {
        // This test binary: started by the loader, linked against the C
        // library.
        let me = std::env::current_exe().unwrap();
        match inspect(&me).unwrap() {
            Program::Dynamic(needed) => {
                assert!(needed.iter().any(|n| n.starts_with("libc.so")), "{needed:?}")
            }
            other => panic!("{other:?}"),
        }
        let header = std::fs::read(&me).unwrap()[..64].to_vec();
        let dir = std::env::temp_dir().join(format!("memhook-preload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, bytes: &[u8]| {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        // Not an object, or too short to be one.
        assert_eq!(
            inspect(&file("script", b"#!/bin/sh\nexit 0\n")).unwrap(),
            Program::NotElf
        );
        assert_eq!(inspect(&file("short", b"\x7fELF")).unwrap(), Program::NotElf);
        // Objects of another class, byte order or processor.
        let mut h = header.clone();
        h[EI_CLASS] = 1;
        assert_eq!(
            inspect(&file("elf32", &h)).unwrap(),
            Program::Foreign("a 32-bit program")
        );
        let mut h = header.clone();
        h[EI_DATA] = 2;
        assert_eq!(
            inspect(&file("be", &h)).unwrap(),
            Program::Foreign("a big-endian program")
        );
        let mut h = header.clone();
        h[18..20].copy_from_slice(&goblin::elf::header::EM_RISCV.to_le_bytes()); // e_machine
        assert_eq!(
            inspect(&file("riscv", &h)).unwrap(),
            Program::Foreign("a program for another processor")
        );
        // No program headers: no interpreter, so no loader.
        let mut h = header.clone();
        h[56..58].copy_from_slice(&0u16.to_le_bytes()); // e_phnum
        assert_eq!(inspect(&file("static", &h)).unwrap(), Program::Static);
        // Program headers past the file's end: an error naming the file,
        // not a panic.
        let mut h = header.clone();
        h[32..40].copy_from_slice(&(1u64 << 40).to_le_bytes()); // e_phoff
        let e = inspect(&file("broken", &h)).unwrap_err();
        assert!(e.contains("broken"), "{e}");
        assert!(inspect(&dir.join("absent")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Damaged programs: whatever bytes stand in the parts `inspect`
    /// reads (the header, the program headers, the dynamic section, its
    /// string table), it answers or gives an error that names the file;
    /// it never panics (a run would end before its command started).
    #[test]
    fn damaged_programs_give_an_answer_or_an_error_never_a_panic() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};

        // A copy of this test binary, and where those parts lie in it.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let elf = goblin::elf::Elf::parse(&me).unwrap();
        let dynamic = elf.program_headers.iter().find(|p| p.p_type == PT_DYNAMIC).unwrap();
        let dynstr = elf
            .section_headers
            .iter()
            .find(|s| elf.shdr_strtab.get_at(s.sh_name) == Some(".dynstr"))
            .unwrap();
        let phdrs = elf.header.e_phoff..elf.header.e_phoff + u64::from(elf.header.e_phnum) * 56;
        let regions = [
            0..64,
            phdrs,
            dynamic.p_offset..dynamic.p_offset + dynamic.p_filesz,
            dynstr.sh_offset..dynstr.sh_offset + dynstr.sh_size,
        ];
        let path = std::env::temp_dir().join(format!("memhook-damaged-{}", std::process::id()));
        std::fs::write(&path, &me).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        assert!(matches!(inspect(&path), Ok(Program::Dynamic(n)) if !n.is_empty()));

        // Up to 8 writes of 1 to 8 bytes each, at random places in the
        // parts; an 8-byte write puts in a whole offset, size or address.
        let write = (
            0..regions.len(),
            any::<u64>(),
            prop::collection::vec(any::<u8>(), 1..=8),
        );
        let mut runner = TestRunner::new(Config {
            cases: 2_000,
            failure_persistence: None,
            ..Config::default()
        });
        let (answers, errors) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        runner
            .run(&prop::collection::vec(write, 1..=8), |writes| {
                let mut undo = Vec::new();
                for (region, at, bytes) in &writes {
                    let r = &regions[*region];
                    let at = r.start + at % (r.end - r.start).max(1);
                    let at = at.min(me.len() as u64 - bytes.len() as u64);
                    undo.push((at, me[at as usize..at as usize + bytes.len()].to_vec()));
                    file.write_all_at(bytes, at).unwrap();
                }
                let result = inspect(&path);
                for (at, bytes) in undo.iter().rev() {
                    file.write_all_at(bytes, *at).unwrap();
                }
                match result {
                    Ok(_) => answers.set(answers.get() + 1),
                    Err(e) => {
                        errors.set(errors.get() + 1);
                        prop_assert!(e.contains(&*path.to_string_lossy()), "{}", e);
                    }
                }
                Ok(())
            })
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        // Both kinds of outcome were reached: the writes reach the
        // parts that are read.
        let (answers, errors) = (answers.get(), errors.get());
        assert!(answers > 0 && errors > 0, "{answers} answers, {errors} errors");
    }

    #[test]
    fn a_command_is_found_as_execvp_finds_it() {
        assert_eq!(command_file(OsStr::new("./x")), Some(PathBuf::from("./x")));
        let sh = command_file(OsStr::new("sh")).expect("sh on PATH");
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{}", sh.display());
        assert_eq!(command_file(OsStr::new("no-such-command-memhook")), None);
    }
}
