//! The workspace's own shape, as cargo sees it: its packages where the design names them, and
//! no two targets writing the same output file.
//! (Two binaries of one name in two packages both go to `target/debug/<name>`: cargo warns
//! "output filename collision", a warning it means to make an error, and whichever is built
//! last is the one a test or a user runs.)

use std::collections::HashMap;

/// `cargo metadata` of the workspace (no dependencies).
fn metadata() -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn no_two_binaries_or_examples_of_the_workspace_share_a_name() {
    let metadata = metadata();
    let packages = metadata["packages"].as_array().unwrap();
    assert!(packages.len() >= 2, "the whole workspace is listed");
    // (kind, name) → the package that has it: binaries share `target/<profile>/`,
    // examples `target/<profile>/examples/`.
    let mut seen: HashMap<(String, String), String> = HashMap::new();
    let mut clashes = Vec::new();
    for package in packages {
        let owner = package["name"].as_str().unwrap();
        for target in package["targets"].as_array().unwrap() {
            let name = target["name"].as_str().unwrap();
            for kind in target["kind"].as_array().unwrap() {
                let kind = kind.as_str().unwrap();
                if kind != "bin" && kind != "example" {
                    continue;
                }
                if let Some(other) = seen.insert((kind.into(), name.into()), owner.into()) {
                    clashes.push(format!("{kind} `{name}` in both {other} and {owner}"));
                }
            }
        }
    }
    assert!(clashes.is_empty(), "{clashes:?}");
    assert!(
        seen.contains_key(&("bin".into(), "tollgate-rules".into())),
        "the rules checker is found: {:?}",
        seen.keys().collect::<Vec<_>>()
    );
}

/// The layout ARCHITECTURE.md names: each package of the workspace in its folder at the top
/// level (the benchmarks in `benches/`, the integration tests in `tests/`).
#[test]
fn the_packages_live_where_the_design_names_them() {
    let metadata = metadata();
    let root = std::path::Path::new(metadata["workspace_root"].as_str().unwrap());
    let folder = |name: &str| {
        let package = metadata["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("package {name} is in the workspace"));
        let manifest = std::path::Path::new(package["manifest_path"].as_str().unwrap());
        manifest
            .parent()
            .unwrap()
            .strip_prefix(root)
            .unwrap()
            .to_path_buf()
    };
    assert_eq!(folder("tollgate"), std::path::Path::new(""));
    assert_eq!(folder("tollgate-bench"), std::path::Path::new("benches"));
    assert_eq!(folder("tollgate-tests"), std::path::Path::new("tests"));
    assert_eq!(
        folder("tollgate-quickstart"),
        std::path::Path::new("examples/quickstart")
    );
}
