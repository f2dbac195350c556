//! Issue 18 item 1: the README's test command on a machine that lacks what it needs. Run with a
//! PATH of stand-ins (a Rust toolchain that answers, a package database where nothing is
//! installed, no root), `scripts/setup.sh` stops at once naming the packages and the command that
//! installs them; `scripts/test.sh` stops when the test assets cannot be prepared instead of
//! running the tests without them (what made every test fail with "HIPSCOPE_TEST_MODEL is not
//! set"). The real run on a fresh machine is the README's note; these hold the failure paths.

#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn stub(dir: &Path, name: &str, body: &str) {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/bash\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A PATH folder with the tools the scripts use, linked from this machine, and stand-ins for
/// the ones whose answers the test decides. `log` collects the stand-ins' calls.
fn bin(dir: &Path, log: &Path, installed: bool, apt: bool) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for tool in ["bash", "grep", "dirname", "cat", "env"] {
        for base in ["/usr/bin", "/bin"] {
            let real = Path::new(base).join(tool);
            if real.exists() {
                std::os::unix::fs::symlink(&real, bin.join(tool)).unwrap();
                break;
            }
        }
    }
    let log = log.display();
    // Not root, and no sudo on PATH.
    stub(&bin, "id", "echo 1000");
    stub(&bin, "cc", "exit 0");
    stub(
        &bin,
        "cargo",
        &format!("echo \"cargo $*\" >> {log}; exit 0"),
    );
    stub(&bin, "python3", "exit 0");
    let status = if installed {
        "echo 'install ok installed'"
    } else {
        "exit 1"
    };
    stub(&bin, "dpkg-query", status);
    if apt {
        stub(
            &bin,
            "apt-get",
            &format!("echo \"apt-get $*\" >> {log}; exit 0"),
        );
    }
    bin
}

fn run(script: &Path, cwd: &Path, path: &Path) -> Output {
    Command::new("/bin/bash")
        .arg(script)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", path)
        .env("HOME", cwd)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn item1_setup_names_the_missing_packages_and_the_command_when_it_cannot_install() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls");
    let script = repo().join("scripts/setup.sh");

    // apt-get there, but no root and no sudo: the command to run, with every missing package.
    let path = bin(&dir.path().join("a"), &log, false, true);
    let out = run(&script, dir.path(), &path);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("installing them needs root")
            && err
                .contains("run: sudo apt-get install libamdhip64-dev librocm-smi-dev debootstrap"),
        "{err}"
    );
    // Nothing was attempted without root.
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!calls.contains("apt-get"), "{calls}");

    // No apt-get at all: says so, naming the packages.
    let path = bin(&dir.path().join("b"), &log, false, false);
    let out = run(&script, dir.path(), &path);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("there is no apt-get to install them: libamdhip64-dev"),
        "{err}"
    );

    // Everything installed: nothing to do, success, no apt-get.
    std::fs::remove_file(&log).ok();
    let path = bin(&dir.path().join("c"), &log, true, true);
    let out = run(&script, dir.path(), &path);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!calls.contains("apt-get"), "{calls}");
}

#[test]
fn item1_test_sh_stops_when_the_assets_fail_instead_of_running_the_tests() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls");
    // A copy of the scripts, with the asset step failing as it does without debootstrap.
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("scripts")).unwrap();
    for s in ["test.sh", "setup.sh"] {
        std::fs::copy(repo().join("scripts").join(s), tree.join("scripts").join(s)).unwrap();
    }
    stub(
        &tree.join("scripts"),
        "test-assets.sh",
        "echo 'test-assets.sh: debootstrap is not installed' >&2; exit 2",
    );
    let path = bin(dir.path(), &log, true, true);
    let out = run(&tree.join("scripts/test.sh"), &tree, &path);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("debootstrap is not installed")
            && err.contains("preparing the test assets failed"),
        "{err}"
    );
    // The tests were built, never run.
    let calls = std::fs::read_to_string(&log).unwrap();
    assert!(calls.contains("cargo test --locked --no-run"), "{calls}");
    assert!(
        !calls
            .lines()
            .any(|l| l.starts_with("cargo test") && !l.contains("--no-run")),
        "{calls}"
    );
}
