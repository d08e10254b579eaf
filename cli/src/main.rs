//! The `memhook` command.

mod scan;

const USAGE: &str = "\
usage:
  memhook scan [--json] [--list] LIB...
      whether bistro can relocate each exported function's prologue
      (--list: also name every refused function and why)
  memhook --version";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--version") | Some("-V") => println!("memhook {}", env!("CARGO_PKG_VERSION")),
        Some("scan") => {
            let json = args.iter().any(|a| a == "--json");
            let list = args.iter().any(|a| a == "--list");
            let libs: Vec<&String> = args[1..].iter().filter(|a| !a.starts_with("--")).collect();
            if libs.is_empty() {
                eprintln!("{USAGE}");
                std::process::exit(2);
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
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    }
}
