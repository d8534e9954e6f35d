//! The examples run as their users run them: an example's own binary, started as a server
//! on a free port (`PORT=0`), its address read from the line it prints.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A running example, killed when dropped.
pub struct Example {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The example binary `name` that `cargo test --workspace --all-features` built beside
/// this test (`target/<profile>/examples/`), the newest if there are several; else one
/// built now with `features`, in a target directory of its own (the running cargo holds
/// the usual one).
fn binary(name: &str, features: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let newest = |dir: PathBuf| {
        let entries = std::fs::read_dir(&dir).ok()?;
        entries
            .filter_map(Result::ok)
            .filter(|e| {
                let file = e.file_name();
                let file = file.to_string_lossy();
                let hashed = file
                    .strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(|h| h.len() == 16 && h.chars().all(|c| c.is_ascii_hexdigit()));
                (file == name || hashed) && e.metadata().is_ok_and(|m| m.is_file())
            })
            .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
            .map(|e| e.path())
    };
    if let Some(path) = newest(profile.join("examples")) {
        return path;
    }
    let target = profile.parent().unwrap().join("example-builds");
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "-p",
            "tollgate",
            "--example",
            name,
            "--features",
            features,
        ])
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the example {name}");
    newest(target.join("debug").join("examples")).expect("the example just built")
}

/// Starts the example `name` (built with `features` if no build of it is found) with
/// `env`, and waits for the line saying where it listens.
pub fn start(name: &str, features: &str, env: &[(&str, &str)]) -> Example {
    let mut child = Command::new(binary(name, features))
        .env("PORT", "0")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the example starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("the example printed where it listens")
            .unwrap();
        if let Some(rest) = line.strip_prefix("listening on ") {
            let rest = rest.split_once("://").map_or(rest, |(_, r)| r);
            let addr = rest.split(['/', ' ']).next().unwrap();
            break addr.parse().unwrap();
        }
    };
    // The rest of what it prints, read so that it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Example { child, addr }
}
