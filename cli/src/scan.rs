//! `memhook scan LIB...`: for every exported function of a shared library,
//! whether bistro can relocate its prologue for the near and the far entry
//! form, or why not. An x86_64 library is scanned for the 5-byte and
//! 13-byte forms, an aarch64 one (on any host: the relocators are pure
//! code) for the 4-byte `b` and the 16-byte `ldr x16; br x16; .quad`,
//! after the landing pad (`bti c`, `paciasp`) that stays in place.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use goblin::elf::Elf;
use goblin::elf::program_header::PT_LOAD;
use goblin::elf::sym::{STB_GLOBAL, STB_WEAK, STT_FUNC, STT_GNU_IFUNC};
use memhook_aarch64::Aarch64;
use memhook_core::patch::{Arch, RelocError, relocate_near};
use memhook_x86_64::X86_64;

/// What scanning one library found.
#[derive(Debug, Default)]
pub struct Scan {
    /// The library's path.
    pub library: String,
    /// The processor it is for ([`Arch::NAME`]).
    pub arch: &'static str,
    /// The near and far entry forms' lengths, in bytes.
    pub near_len: usize,
    /// See `near_len`.
    pub far_len: usize,
    /// Distinct exported functions (aliases counted once).
    pub total: usize,
    /// Patchable with the near form.
    pub near: usize,
    /// Patchable with the near form leaving the entry's first instruction
    /// in place (a landing pad, or one bistro keeps ahead of its patch:
    /// [`Arch::keep_first`]): a uprobe on the entry then leaves the hook
    /// whole.
    pub entry_kept: usize,
    /// Patchable with the far form.
    pub far: usize,
    /// Refused even with the near form.
    pub refused: usize,
    /// Reason for each refusal (of the near form), counted.
    pub reasons: BTreeMap<&'static str, usize>,
    /// Reason for each refusal of the far form, counted.
    pub far_reasons: BTreeMap<&'static str, usize>,
    /// Refused functions, with their reason (for the table's detail).
    pub refused_names: Vec<(String, &'static str)>,
    /// Functions patched near at their entry (not [`Scan::entry_kept`]:
    /// a uprobe on the entry would turn the hook off while it is on),
    /// with why and the first bytes (for the table's detail).
    pub unkept_names: Vec<(String, String)>,
}

fn reason(e: &RelocError) -> &'static str {
    match e {
        RelocError::FunctionTooShort { .. } => "function shorter than the patch",
        RelocError::BranchIntoPatch { .. } => "branch back into the patched bytes",
        RelocError::Undecodable { .. } => "undecodable bytes",
        RelocError::OutOfRange { .. } => "PC-relative operand out of reach",
        RelocError::Unsupported { what, .. } => what,
        RelocError::Breakpoint { .. } => "a breakpoint in the patched bytes",
        RelocError::TrampolineFull => "trampoline full",
        RelocError::NotEnoughBytes { .. } => "not enough bytes",
    }
}

/// Scans the library at `path`.
///
/// # Errors
///
/// A message when the file cannot be read or parsed, or is for neither
/// x86_64 nor aarch64.
pub fn scan(path: &str) -> Result<Scan, String> {
    let data = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    if let Some(named) = linker_script_libraries(&data) {
        // `libc.so`, `libm.so`, `libncurses.so`: what `-lc` links, not
        // what a program loads.
        return Err(format!(
            "{path}: a linker script, not an ELF object; scan what it names: {}",
            if named.is_empty() {
                "(none)".to_string()
            } else {
                named.join(" ")
            }
        ));
    }
    let elf = Elf::parse(&data).map_err(|e| format!("{path}: not an ELF object: {e}"))?;
    match elf.header.e_machine {
        goblin::elf::header::EM_X86_64 => Ok(scan_for::<X86_64>(path, &data, &elf)),
        goblin::elf::header::EM_AARCH64 => Ok(scan_for::<Aarch64>(path, &data, &elf)),
        m => Err(format!(
            "{path}: neither an x86_64 nor an aarch64 object (e_machine {m})"
        )),
    }
}

/// The shared objects a GNU ld script names in its `GROUP` or `INPUT`
/// (`/lib/x86_64-linux-gnu/libc.so.6`, `libncurses.so.6`), or `None` when
/// `data` is no such script (an ELF object starts with a byte no text
/// has).
fn linker_script_libraries(data: &[u8]) -> Option<Vec<String>> {
    let text = std::str::from_utf8(data.get(..data.len().min(64 * 1024))?).ok()?;
    // Comments out, then the commands' parentheses as separators.
    let mut plain = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("/*") {
        plain.push_str(&rest[..at]);
        rest = rest[at..].find("*/").map_or("", |end| &rest[at + end + 2..]);
    }
    plain.push_str(rest);
    let words: Vec<&str> = plain
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .collect();
    if !words.iter().any(|w| matches!(*w, "GROUP" | "INPUT")) {
        return None;
    }
    Some(
        words
            .into_iter()
            .filter(|w| w.contains(".so") && !w.starts_with('-'))
            .map(str::to_string)
            .collect(),
    )
}

/// [`scan`] of a parsed object for `A`.
fn scan_for<A: Arch>(path: &str, data: &[u8], elf: &Elf) -> Scan {
    // File bytes of a virtual address, up to 64, within its PT_LOAD segment.
    let bytes_at = |vaddr: u64| -> Option<&[u8]> {
        elf.program_headers
            .iter()
            .filter(|ph| ph.p_type == PT_LOAD)
            .find_map(|ph| {
                let end = ph.p_vaddr + ph.p_filesz;
                (ph.p_vaddr <= vaddr && vaddr < end).then(|| {
                    let off = (ph.p_offset + (vaddr - ph.p_vaddr)) as usize;
                    let len = ((end - vaddr) as usize).min(64);
                    data.get(off..off + len).unwrap_or(&[])
                })
            })
    };
    let mut functions: BTreeMap<u64, String> = BTreeMap::new();
    for sym in elf.dynsyms.iter() {
        let kind = sym.st_type();
        let bind = sym.st_bind();
        if (kind == STT_FUNC || kind == STT_GNU_IFUNC)
            && (bind == STB_GLOBAL || bind == STB_WEAK)
            && sym.st_shndx != 0
            && sym.st_value != 0
        {
            let name = elf.dynstrtab.get_at(sym.st_name).unwrap_or("?").to_string();
            functions.entry(sym.st_value).or_insert(name);
        }
    }
    let mut out = Scan {
        library: path.to_string(),
        arch: A::NAME,
        near_len: A::NEAR_JUMP_LEN,
        far_len: A::FAR_JUMP_LEN,
        ..Scan::default()
    };
    // A load address where the library sits, and near/far trampolines.
    const BASE: usize = 0x7f00_0000_0000;
    for (&vaddr, name) in &functions {
        out.total += 1;
        let entry = BASE + vaddr as usize;
        let code = bytes_at(vaddr).unwrap_or(&[]);
        // As bistro patches: after a kept first instruction where it can.
        match relocate_near::<A>(code, entry, entry + (1 << 20)) {
            Ok(r) => {
                out.near += 1;
                if r.skip > 0 {
                    out.entry_kept += 1;
                } else {
                    let why = if A::keep_first(code).is_some() {
                        "the code after its first instruction cannot be moved"
                    } else {
                        "its first instruction cannot run before the hook"
                    };
                    let first: Vec<String> = code.iter().take(8).map(|b| format!("{b:02x}")).collect();
                    out.unkept_names
                        .push((name.clone(), format!("{why} (first bytes: {})", first.join(" "))));
                }
            }
            Err(e) => {
                out.refused += 1;
                let r = reason(&e);
                *out.reasons.entry(r).or_default() += 1;
                out.refused_names.push((name.clone(), r));
            }
        }
        match A::relocate(code, entry, A::FAR_JUMP_LEN, entry + (1 << 20)) {
            Ok(_) => out.far += 1,
            Err(e) => *out.far_reasons.entry(reason(&e)).or_default() += 1,
        }
    }
    out
}

pub(crate) fn json_string(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

impl Scan {
    /// SPEC.md's JSON object, then `arch` (`"x86_64"`, `"aarch64"`),
    /// `far_reasons` (the far form's refusals, counted as `reasons`) and
    /// `entry_kept` ([`Scan::entry_kept`]).
    pub fn json(&self) -> String {
        let counts = |m: &BTreeMap<&str, usize>| {
            m.iter()
                .map(|(k, v)| format!("{}: {v}", json_string(k)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "{{\"library\": {}, \"total\": {}, \"near\": {}, \"far\": {}, \"refused\": {}, \"reasons\": {{{}}}, \"arch\": {}, \"far_reasons\": {{{}}}, \"entry_kept\": {}}}",
            json_string(&self.library),
            self.total,
            self.near,
            self.far,
            self.refused,
            counts(&self.reasons),
            json_string(self.arch),
            counts(&self.far_reasons),
            self.entry_kept
        )
    }

    /// A table for people.
    pub fn table(&self) -> String {
        let pct = |n: usize| {
            if self.total == 0 {
                0.0
            } else {
                100.0 * n as f64 / self.total as f64
            }
        };
        let mut o = String::new();
        let _ = writeln!(o, "{}: {} exported functions", self.library, self.total);
        let near = format!("{}-byte entry (near):", self.near_len);
        let far = format!("{}-byte entry (far):", self.far_len);
        let _ = writeln!(o, "  {near:21} {:6} ({:.1}%)", self.near, pct(self.near));
        let _ = writeln!(
            o,
            "    entry kept:         {:6} ({:.1}%; a uprobe on it leaves the hook whole)",
            self.entry_kept,
            pct(self.entry_kept)
        );
        let _ = writeln!(o, "  {far:21} {:6} ({:.1}%)", self.far, pct(self.far));
        let _ = writeln!(
            o,
            "  refused:              {:6} ({:.1}%)",
            self.refused,
            pct(self.refused)
        );
        for (r, n) in &self.reasons {
            let _ = writeln!(o, "    {n:6}  {r}");
        }
        // What the far form alone refuses: where no near slot can be had
        // (x86_64: no trampoline page within 2 GiB; aarch64: 128 MiB).
        let far_refused = self.total - self.far;
        if far_refused > 0 {
            let _ = writeln!(o, "  refused the far form: {far_refused:6} ({:.1}%)", pct(far_refused));
            for (r, n) in &self.far_reasons {
                let _ = writeln!(o, "    {n:6}  {r}");
            }
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary's own libc: almost every export relocates, every
    /// refusal has a reason, and nothing panics.
    #[test]
    fn scans_the_libc_this_process_uses() {
        let libc = host_libc();
        let s = scan(libc).unwrap();
        assert_eq!((s.arch, s.near_len, s.far_len), ("x86_64", 5, 13));
        assert!(s.total > 1000, "{}", s.table());
        every_function_counted(&s);
        assert!(s.near as f64 >= 0.95 * s.total as f64, "{}", s.table());
        assert!(s.json().starts_with("{\"library\": \""));
        assert!(s.json().contains("\"arch\": \"x86_64\""), "{}", s.json());
        // Past `endbr64` (a CET build: all) or a kept first instruction:
        // most of what patches near (Debian 12's glibc, no CET: 1,884 of
        // 2,175).
        assert!(s.entry_kept as f64 >= 0.8 * s.near as f64, "{}", s.table());
        assert_eq!(s.entry_kept + s.unkept_names.len(), s.near);
        // Its host functions' entries among them: not one listed unkept.
        for f in [
            "mmap", "munmap", "mremap", "brk", "sbrk", "madvise", "open", "syscall", "ioctl",
        ] {
            assert!(
                s.unkept_names.iter().all(|(name, _)| name != f),
                "{f}: {:?}",
                s.unkept_names
            );
        }
        assert!(
            s.json().contains(&format!("\"entry_kept\": {}}}", s.entry_kept)),
            "{}",
            s.json()
        );
    }

    /// This machine's glibc.
    fn host_libc() -> &'static str {
        ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("a glibc to scan")
    }

    /// Each function is counted once for each form: relocated, or refused
    /// with a reason.
    fn every_function_counted(s: &Scan) {
        assert_eq!(s.near + s.refused, s.total, "{}", s.table());
        assert_eq!(s.reasons.values().sum::<usize>(), s.refused, "{}", s.table());
        assert_eq!(s.refused_names.len(), s.refused);
        assert_eq!(s.far + s.far_reasons.values().sum::<usize>(), s.total, "{}", s.table());
    }

    /// An object marked aarch64 is scanned with the aarch64 relocator,
    /// whatever its bytes: here this machine's libc relabelled, so x86_64
    /// code read as aarch64 words (garbage to it). No panic, and every
    /// function counted under one form or the other's reason.
    #[test]
    fn an_aarch64_object_is_scanned_for_aarch64_on_any_host() {
        let libc = host_libc();
        let mut bytes = std::fs::read(libc).unwrap();
        bytes[18..20].copy_from_slice(&goblin::elf::header::EM_AARCH64.to_le_bytes()); // e_machine
        let relabelled = std::env::temp_dir().join(format!("memhook-scan-a64-{}", std::process::id()));
        std::fs::write(&relabelled, &bytes).unwrap();
        let s = scan(relabelled.to_str().unwrap());
        let _ = std::fs::remove_file(&relabelled);
        let s = s.unwrap();
        assert_eq!((s.arch, s.near_len, s.far_len), ("aarch64", 4, 16));
        assert!(s.total > 1000, "{}", s.table());
        every_function_counted(&s);
        assert!(s.table().contains("4-byte entry (near):"), "{}", s.table());
    }

    /// Debian's arm64 libraries (the cross toolchain's libc and libm, and
    /// libstdc++ of arm64): the 4-byte `b` relocates at every export (one
    /// instruction moves, and only a branch into it could stop it), and the
    /// 16-byte form at most. Skipped where they are not installed, unless
    /// MEMHOOK_TEST_ARM64_LIBS=1 (CI's aarch64 step installs them).
    #[test]
    fn aarch64_libraries_of_debian() {
        let libs = [
            ("/usr/aarch64-linux-gnu/lib/libc.so.6", 80.0),
            ("/usr/aarch64-linux-gnu/lib/libm.so.6", 80.0),
            ("/usr/lib/aarch64-linux-gnu/libstdc++.so.6", 80.0),
        ];
        let required = std::env::var_os("MEMHOOK_TEST_ARM64_LIBS").is_some_and(|v| v == "1");
        for (lib, far_bar) in libs {
            if !std::path::Path::new(lib).exists() {
                assert!(!required, "{lib}: not installed, and MEMHOOK_TEST_ARM64_LIBS=1");
                eprintln!("scan: {lib} not installed: skipped");
                continue;
            }
            let s = scan(lib).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(s.arch, "aarch64");
            assert!(s.total > 400, "{}", s.table());
            every_function_counted(&s);
            assert_eq!(s.near, s.total, "{}", s.table());
            let far = 100.0 * s.far as f64 / s.total as f64;
            assert!(far >= far_bar, "{lib}: far form {far:.1}% < {far_bar}%\n{}", s.table());
            eprint!("{}", s.table());
        }
    }

    /// SPEC.md's coverage bars for the 5-byte form on Debian 12's
    /// libraries (the machines this project is built and tested on).
    #[test]
    fn coverage_meets_the_bars_on_debian_12() {
        for (lib, bar) in [
            ("/lib/x86_64-linux-gnu/libc.so.6", 98.5),
            ("/usr/lib/x86_64-linux-gnu/libstdc++.so.6", 96.5),
            ("/lib/x86_64-linux-gnu/libm.so.6", 99.5),
        ] {
            let s = scan(lib).unwrap_or_else(|e| panic!("{e}"));
            let pct = 100.0 * s.near as f64 / s.total as f64;
            assert!(pct >= bar, "{lib}: {pct:.1}% < {bar}%\n{}", s.table());
        }
    }

    #[test]
    fn bad_input_is_a_message() {
        assert!(scan("/nonexistent/lib.so").unwrap_err().contains("/nonexistent/lib.so"));
        let not_elf = std::env::temp_dir().join(format!("memhook-not-elf-{}", std::process::id()));
        std::fs::write(&not_elf, b"hello").unwrap();
        let e = scan(not_elf.to_str().unwrap()).unwrap_err();
        assert!(e.contains("not an ELF object"), "{e}");
        // A linker script (`libc.so`): the objects it names, to scan.
        for (script, named) in [
            (
                "/* GNU ld script\n   Use the shared library.  */\nOUTPUT_FORMAT(elf64-x86-64)\nGROUP ( /lib/x86_64-linux-gnu/libc.so.6 /usr/lib/x86_64-linux-gnu/libc_nonshared.a  AS_NEEDED ( /lib64/ld-linux-x86-64.so.2 ) )\n",
                "/lib/x86_64-linux-gnu/libc.so.6 /lib64/ld-linux-x86-64.so.2",
            ),
            ("INPUT(libncurses.so.6 -ltinfo)\n", "libncurses.so.6"),
            ("INPUT(-lfoo)\n", "(none)"),
        ] {
            std::fs::write(&not_elf, script).unwrap();
            let e = scan(not_elf.to_str().unwrap()).unwrap_err();
            assert!(
                e.ends_with(&format!(
                    "a linker script, not an ELF object; scan what it names: {named}"
                )),
                "{e}"
            );
        }
        let _ = std::fs::remove_file(&not_elf);
        // An ELF object of another processor: named, not scanned.
        let mut riscv = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        riscv[18..20].copy_from_slice(&goblin::elf::header::EM_RISCV.to_le_bytes());
        let path = std::env::temp_dir().join(format!("memhook-scan-riscv-{}", std::process::id()));
        std::fs::write(&path, &riscv).unwrap();
        let e = scan(path.to_str().unwrap()).unwrap_err();
        let _ = std::fs::remove_file(&path);
        assert!(
            e.contains("neither an x86_64 nor an aarch64 object (e_machine 243)"),
            "{e}"
        );
    }
}
