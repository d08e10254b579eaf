//! `memhook scan LIB...`: for every exported function of a shared library,
//! whether bistro can relocate its prologue for the 5-byte (near) and the
//! 13-byte (far) entry form, or why not.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use goblin::elf::Elf;
use goblin::elf::program_header::PT_LOAD;
use goblin::elf::sym::{STB_GLOBAL, STB_WEAK, STT_FUNC, STT_GNU_IFUNC};
use memhook_core::patch::{Arch, RelocError};
use memhook_x86_64::X86_64;

/// What scanning one library found.
#[derive(Debug, Default)]
pub struct Scan {
    /// The library's path.
    pub library: String,
    /// Distinct exported functions (aliases counted once).
    pub total: usize,
    /// Patchable with the 5-byte form.
    pub near: usize,
    /// Patchable with the 13-byte form.
    pub far: usize,
    /// Refused even with the 5-byte form.
    pub refused: usize,
    /// Reason for each refusal (of the 5-byte form), counted.
    pub reasons: BTreeMap<&'static str, usize>,
    /// Refused functions, with their reason (for the table's detail).
    pub refused_names: Vec<(String, &'static str)>,
}

fn reason(e: &RelocError) -> &'static str {
    match e {
        RelocError::FunctionTooShort { .. } => "function shorter than the patch",
        RelocError::BranchIntoPatch { .. } => "branch back into the patched bytes",
        RelocError::Undecodable { .. } => "undecodable bytes",
        RelocError::OutOfRange { .. } => "PC-relative operand out of reach",
        RelocError::Unsupported { what, .. } => what,
        RelocError::TrampolineFull => "trampoline full",
        RelocError::NotEnoughBytes { .. } => "not enough bytes",
    }
}

/// Scans the library at `path`.
///
/// # Errors
///
/// A message when the file cannot be read or parsed, or is not x86_64.
pub fn scan(path: &str) -> Result<Scan, String> {
    let data = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    let elf = Elf::parse(&data).map_err(|e| format!("{path}: not an ELF object: {e}"))?;
    if elf.header.e_machine != goblin::elf::header::EM_X86_64 {
        return Err(format!(
            "{path}: not an x86_64 object (e_machine {})",
            elf.header.e_machine
        ));
    }
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
        ..Scan::default()
    };
    // A load address where the library sits, and near/far trampolines.
    const BASE: usize = 0x7f00_0000_0000;
    for (&vaddr, name) in &functions {
        out.total += 1;
        let entry = BASE + vaddr as usize;
        let code = bytes_at(vaddr).unwrap_or(&[]);
        match X86_64::relocate(code, entry, X86_64::NEAR_JUMP_LEN, entry + (1 << 20)) {
            Ok(_) => out.near += 1,
            Err(e) => {
                out.refused += 1;
                let r = reason(&e);
                *out.reasons.entry(r).or_default() += 1;
                out.refused_names.push((name.clone(), r));
            }
        }
        if X86_64::relocate(code, entry, X86_64::FAR_JUMP_LEN, entry + (1 << 20)).is_ok() {
            out.far += 1;
        }
    }
    Ok(out)
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
    /// SPEC.md's JSON object.
    pub fn json(&self) -> String {
        let reasons: Vec<String> = self
            .reasons
            .iter()
            .map(|(k, v)| format!("{}: {v}", json_string(k)))
            .collect();
        format!(
            "{{\"library\": {}, \"total\": {}, \"near\": {}, \"far\": {}, \"refused\": {}, \"reasons\": {{{}}}}}",
            json_string(&self.library),
            self.total,
            self.near,
            self.far,
            self.refused,
            reasons.join(", ")
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
        let _ = writeln!(o, "  5-byte entry (near):  {:6} ({:.1}%)", self.near, pct(self.near));
        let _ = writeln!(o, "  13-byte entry (far):  {:6} ({:.1}%)", self.far, pct(self.far));
        let _ = writeln!(
            o,
            "  refused:              {:6} ({:.1}%)",
            self.refused,
            pct(self.refused)
        );
        for (r, n) in &self.reasons {
            let _ = writeln!(o, "    {n:6}  {r}");
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
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("a glibc to scan");
        let s = scan(libc).unwrap();
        assert!(s.total > 1000, "{}", s.table());
        assert_eq!(s.near + s.refused, s.total);
        assert_eq!(s.reasons.values().sum::<usize>(), s.refused);
        assert!(s.near as f64 >= 0.95 * s.total as f64, "{}", s.table());
        assert!(s.json().starts_with("{\"library\": \""));
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
        let _ = std::fs::remove_file(&not_elf);
    }
}
