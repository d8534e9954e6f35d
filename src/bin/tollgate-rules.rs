//! `tollgate-rules check FILE`: checks a rules document (TOML, or JSON for `.json` files)
//! as a server would load it, and prints its limits.
//!
//! Exit status 0 when the rules are valid; 1 with the error (`rules.toml:14:
//! limits[2].quota: ...`) on standard error when they are not (a file that is not a
//! regular one, is larger than 16 MiB or nests more than 128 levels deep included, as a
//! server would refuse it); 2 for a bad command line.

use std::path::Path;
use std::process::ExitCode;

use tollgate::rules::{Document, Format};

const USAGE: &str = "usage: tollgate-rules check FILE";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [command, file] if command == "check" => check(Path::new(file)),
        [flag] if flag == "-h" || flag == "--help" => {
            println!(
                "{USAGE}\n\nChecks a rules document (TOML, or JSON for .json files) and prints its limits."
            );
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn check(path: &Path) -> ExitCode {
    match load(path) {
        Ok(doc) => {
            print!("{doc}");
            println!("{}: {} limits, valid", path.display(), doc.limits.len());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// Reads and checks the document as `Rules` does, with the error located in the file.
fn load(path: &Path) -> Result<Document, tollgate::ConfigError> {
    let format = Format::from_path(path);
    // Builds the rules over a throwaway store, without watching: the same checks, the
    // same messages as a server loading the file.
    let rules = tollgate::rules::Rules::builder(tollgate::store::MemoryStore::new())
        .file(path)
        .format(format)
        .watch(false)
        .sighup(false)
        .build()?;
    Ok((*rules.document()).clone())
}
