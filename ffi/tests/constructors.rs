//! The order of `libmemhook.so`'s constructors. The memtype map's advice
//! for transparent huge pages must run before any other constructor of
//! memhook's: the library's own (`preload::at_load`) installs the hooks
//! when it is preloaded or told to trace or report, and where libcuda is
//! loaded already (a late `dlopen`) that install lays the map out as the
//! CUDA hooks attach (2 MiB of writes). A 2 MiB region first touched
//! before its advice keeps its 4 KiB pages, so the map would lose the
//! huge pages its lookups are measured with.

use std::path::PathBuf;

use goblin::elf::Elf;

/// libmemhook.so, as `examples.rs` finds it: built from the current
/// sources where the test has the default features, else the one cargo
/// built with the test's own.
fn lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    memhook_tests::libmemhook::libmemhook(&dir, cfg!(feature = "bistro"))
}

/// The functions `.init_array` lists, in the order the loader calls them:
/// each entry's symbol (`None` where no symbol starts there).
fn constructors(bytes: &[u8]) -> Vec<Option<String>> {
    let elf = Elf::parse(bytes).expect("libmemhook.so parses as ELF");
    let init = elf
        .section_headers
        .iter()
        .find(|s| elf.shdr_strtab.get_at(s.sh_name) == Some(".init_array"))
        .expect("an .init_array section");
    let (lo, hi) = (init.sh_addr, init.sh_addr + init.sh_size);
    // A position-independent object's entries are relative relocations:
    // the target is the addend (the section's own words are 0).
    let mut entries: Vec<(u64, u64)> = elf
        .dynrelas
        .iter()
        .filter(|r| (lo..hi).contains(&r.r_offset))
        .map(|r| (r.r_offset, r.r_addend.unwrap_or(0) as u64))
        .collect();
    entries.sort();
    assert_eq!(entries.len() as u64, init.sh_size / 8, "every entry is relocated");
    entries
        .iter()
        .map(|&(_, target)| {
            elf.syms
                .iter()
                .find(|s| s.st_value == target && s.is_function())
                .and_then(|s| elf.strtab.get_at(s.st_name))
                .map(str::to_string)
        })
        .collect()
}

#[test]
fn the_maps_advice_runs_before_any_other_constructor_of_memhooks() {
    let bytes = std::fs::read(lib()).unwrap();
    let names = constructors(&bytes);
    if names.iter().all(Option::is_none) {
        println!("libmemhook.so has no symbol table (stripped): not checked");
        return;
    }
    let memhooks: Vec<&str> = names
        .iter()
        .flatten()
        .map(String::as_str)
        .filter(|n| n.contains("7memhook"))
        .collect();
    let advice = memhooks
        .iter()
        .position(|n| n.contains("advise_huge_pages_at_load"))
        .unwrap_or_else(|| panic!("the advice is a constructor: {names:?}"));
    assert!(
        memhooks.iter().any(|n| n.contains("preload") && n.contains("at_load")),
        "the preloaded library's install is a constructor: {names:?}"
    );
    assert_eq!(
        advice, 0,
        "the advice runs first of memhook's constructors: {memhooks:#?}"
    );
}

/// The map's static in the library: its offset and size (the symbol).
fn map_symbol(bytes: &[u8]) -> Option<(u64, u64)> {
    let elf = Elf::parse(bytes).ok()?;
    elf.syms
        .iter()
        .find(|s| {
            elf.strtab
                .get_at(s.st_name)
                .is_some_and(|n| n.starts_with("_ZN7memhook7memtype3MAP"))
        })
        .map(|s| (s.st_value, s.st_size))
}

/// Loaded late (libcuda loaded first, its allocations live), the library
/// installs from its constructor and the CUDA hooks lay out the map, which
/// still lies on huge pages: wherever a control region advised and touched
/// in the same process gets them.
#[test]
fn a_late_load_that_lays_out_the_map_at_install_keeps_it_on_huge_pages() {
    let lib = lib();
    let bytes = std::fs::read(&lib).unwrap();
    let Some((offset, size)) = map_symbol(&bytes) else {
        println!("libmemhook.so has no symbol table (stripped): not checked");
        return;
    };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::temp_dir().join(format!("memhook-late-load-{}", std::process::id()));
    let fake = memhook_tests::fakecuda::build(&dir);
    let exe = dir.join("late_load");
    memhook_tests::cc::build(
        memhook_tests::cc::command()
            .args(["-O2", "-Wall", "-Werror", "-I"])
            .arg(root.join("include"))
            .arg(root.join("tests/c/late_load.c"))
            .arg("-o")
            .arg(&exe)
            .arg(&fake.libcuda)
            .args(["-ldl", "-Wl,-rpath,$ORIGIN"]),
        "late_load.c",
    );
    let out = memhook_tests::command(&exe)
        .arg(&lib)
        .arg(format!("{offset:x}"))
        .arg(format!("{size:x}"))
        .env("MEMHOOK_TRACE", "1")
        .env("FAKECUDA_ARENA_GIB", "4")
        .env_remove("MEMHOOK_MAP_HUGE_PAGES")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}: {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let figure = |name: &str| -> i64 {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {stdout}"))
    };
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        figure("recorded"),
        16,
        "the install at load hooked the driver: {stdout}"
    );
    if figure("control") <= 0 {
        println!("no transparent huge page for an advised region here: not checked ({stdout})");
        return;
    }
    assert!(figure("map") > 0, "the map lost its huge pages: {stdout}");
}
