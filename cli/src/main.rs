//! The `memhook` command.

mod demo;
mod doctor;
mod preload;
mod run;
mod scan;

pub(crate) use scan::json_string;

use memhook::config::{Family, ModeSet};

const USAGE: &str = "\
usage:
  memhook run [--cuda-mode M] [--mmap-mode M] [--trace] [--json] [--] CMD [ARGS...]
      run CMD with the hooks preloaded; summarise its memory events
  memhook doctor
      which hook modes work on this machine, and why not
  memhook scan [--json] [--list] LIB...
      whether bistro can relocate each exported function's prologue
      (an x86_64 or aarch64 library, on either; --list: also name every
      function the near form refuses, and why, and every one it patches
      at the entry, where a uprobe would turn the hook off)
  memhook demo
      a built-in workload: host mappings, and CUDA memory with a GPU
  memhook --version
An option's value may follow `=` (--cuda-mode=bistro,procaddr); `--help`
after any command prints this.";

/// `--help` (of memhook or of a subcommand): the usage on stdout, status 0.
fn help() -> ! {
    println!("{USAGE}");
    std::process::exit(0);
}

/// A usage error: one line, then exit status 2.
fn usage_error(msg: &str) -> ! {
    eprintln!("memhook: {msg} (memhook --help for usage)");
    std::process::exit(2);
}

fn parse_run(args: &[String]) -> run::Options {
    let mut opts = run::Options {
        cuda_mode: None,
        mmap_mode: None,
        trace: false,
        json: false,
        command: Vec::new(),
    };
    let mut i = 0;
    while i < args.len() {
        // `--cuda-mode=M` as well as `--cuda-mode M`.
        let (a, inline) = match args[i].split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
            _ => (args[i].as_str(), None),
        };
        match a {
            "--" => {
                opts.command = args[i + 1..].to_vec();
                break;
            }
            "--help" | "-h" => help(),
            "--trace" | "--json" if inline.is_some() => usage_error(&format!("run: {a} takes no value")),
            "--trace" => opts.trace = true,
            "--json" => opts.json = true,
            "--cuda-mode" | "--mmap-mode" => {
                let value = match inline {
                    Some(v) => Some(v),
                    None => {
                        i += 1;
                        args.get(i).cloned()
                    }
                };
                let Some(v) = value else {
                    usage_error(&format!("run: {a} needs a value"));
                };
                let family = if a == "--cuda-mode" { Family::Cuda } else { Family::Mmap };
                if let Err(e) = ModeSet::parse(&v, family, memhook::AVAILABLE_MODES) {
                    usage_error(&format!("run: {a}: {e}"));
                }
                if family == Family::Cuda {
                    opts.cuda_mode = Some(v);
                } else {
                    opts.mmap_mode = Some(v);
                }
            }
            _ if a.starts_with('-') => usage_error(&format!("run: unknown option `{}`", args[i])),
            _ => {
                opts.command = args[i..].to_vec();
                break;
            }
        }
        i += 1;
    }
    if opts.command.is_empty() {
        usage_error("run: no command given");
    }
    opts
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or_default();
    match args.first().map(String::as_str) {
        Some("--version") | Some("-V") => println!("memhook {}", env!("CARGO_PKG_VERSION")),
        Some("--help") | Some("-h") | Some("help") => help(),
        Some("run") => {
            let opts = parse_run(rest);
            match run::run(opts) {
                Ok(ended) => run::leave(ended),
                Err(e) => {
                    eprintln!("memhook run: {}", e.message);
                    std::process::exit(e.code);
                }
            }
        }
        Some("doctor" | "demo" | "scan") if rest.iter().any(|a| a == "--help" || a == "-h") => help(),
        Some("doctor") => {
            if let Some(a) = rest.first() {
                usage_error(&format!("doctor takes no arguments (got `{a}`)"));
            }
            std::process::exit(doctor::doctor());
        }
        Some("demo") => {
            if let Some(a) = rest.first() {
                usage_error(&format!("demo takes no arguments (got `{a}`)"));
            }
            std::process::exit(demo::demo());
        }
        Some("scan") => {
            if let Some(bad) = rest
                .iter()
                .find(|a| a.starts_with('-') && !["--json", "--list"].contains(&a.as_str()))
            {
                usage_error(&format!("scan: unknown option `{bad}`"));
            }
            let json = rest.iter().any(|a| a == "--json");
            let list = rest.iter().any(|a| a == "--list");
            let libs: Vec<&String> = rest.iter().filter(|a| !a.starts_with("--")).collect();
            if libs.is_empty() {
                usage_error("scan: no library given");
            }
            let mut failed = false;
            for lib in libs {
                match scan::scan(lib) {
                    Ok(s) if json => println!("{}", s.json()),
                    Ok(s) => {
                        print!("{}", s.table());
                        if list {
                            for (name, why) in &s.refused_names {
                                println!("    refused {name}: {why}");
                            }
                            for (name, why) in &s.unkept_names {
                                println!("    entry not kept {name}: {why}");
                            }
                        }
                    }
                    Err(e) => {
                        eprintln!("memhook scan: {e}");
                        failed = true;
                    }
                }
            }
            std::process::exit(i32::from(failed));
        }
        Some(other) => usage_error(&format!("unknown command `{other}`")),
        None => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    }
}
