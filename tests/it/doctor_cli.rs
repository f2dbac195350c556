//! `hipscope doctor` and `hipscope top` as a user runs them: on this machine, on the fixture
//! trees, and with the fake device, whose injected hang must be reported by name.

use crate::common;

use common::{hipscope, repo_path};

fn fixture_args(name: &str) -> Vec<String> {
    let root = repo_path("tests/data/sysfs").join(name);
    vec![
        "--sysfs-root".into(),
        root.join("sys").display().to_string(),
        "--procfs-root".into(),
        root.join("proc").display().to_string(),
    ]
}

#[test]
fn doctor_runs_to_completion_here_and_exits_with_the_documented_code() {
    let out = hipscope().arg("doctor").output().expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    let code = out.status.code();
    // 0 when nothing failed, 1 when something did: the report's own count decides.
    let failed = text.lines().any(|l| l.starts_with("FAIL "));
    assert_eq!(code, Some(if failed { 1 } else { 0 }), "{text}");
    for section in ["[environment]", "[devices]", "[functional]"] {
        assert!(text.contains(section), "{section} missing:\n{text}");
    }
    assert!(text.contains(" passed, "), "{text}");
}

#[test]
fn doctor_on_fixtures_names_known_issues_and_fails_only_where_one_is_fatal() {
    let out = hipscope()
        .arg("doctor")
        .args(fixture_args("strix-halo"))
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("FAIL mes-0x83"), "{text}");
    assert!(text.contains("ROCm/ROCm#5724"), "{text}");
    assert!(text.contains("reading a captured tree"), "{text}");

    let out = hipscope()
        .args(["doctor", "--json"])
        .args(fixture_args("rx7900xtx"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["facts"]["gpus"][0]["arch"], "gfx1100");
    assert!(v["checks"].as_array().is_some_and(|c| !c.is_empty()));
}

#[test]
fn doctor_usage_errors_exit_2() {
    let out = hipscope()
        .args(["doctor", "--no-such-flag"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn doctor_capture_replays_to_the_same_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cap = dir.path().join("cap");
    let out = hipscope()
        .args(["doctor", "--no-functional", "--capture"])
        .arg(&cap)
        .args(fixture_args("strix-halo"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(cap.join("doctor.json").is_file());
    assert!(
        cap.join("sys/class/drm/card0/device/gpu_metrics").is_file(),
        "the binary table is captured"
    );
    let replay = hipscope()
        .args(["doctor", "--no-functional", "--sysfs-root"])
        .arg(cap.join("sys"))
        .arg("--procfs-root")
        .arg(cap.join("proc"))
        .output()
        .expect("run");
    let a = String::from_utf8_lossy(&out.stdout);
    let b = String::from_utf8_lossy(&replay.stdout);
    let devices = |t: &str| -> String {
        t.lines()
            .filter(|l| l.contains("card0") || l.contains("mes-0x83"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(devices(&a), devices(&b));
    assert!(!devices(&a).is_empty());
}

#[test]
fn a_hanging_check_is_killed_at_its_deadline_and_named() {
    let t = std::time::Instant::now();
    let out = hipscope()
        .args([
            "doctor",
            "--backend",
            "fake",
            "--only",
            "gemm,hang",
            "--deadline",
            "3",
        ])
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("PASS device opens"), "{text}");
    assert!(text.contains("PASS gemm"), "{text}");
    let hang = text
        .lines()
        .find(|l| l.starts_with("FAIL hang"))
        .unwrap_or_else(|| panic!("no hang line:\n{text}"));
    assert!(hang.contains("HUNG"), "{hang}");
    assert!(hang.contains("injected hang"), "{hang}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(30),
        "the doctor did not move on"
    );
}

#[test]
fn top_once_json_prints_one_sample() {
    let out = hipscope()
        .args(["top", "--once", "--json"])
        .output()
        .expect("run");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 1, "{text}");
    let v: serde_json::Value = serde_json::from_str(text.trim()).expect("JSON");
    assert!(
        v["host"]["mem_total"].as_u64().is_some_and(|m| m > 0),
        "{v}"
    );
    assert!(v["gpus"].is_array());

    let out = hipscope()
        .args(["top", "--json", "--count", "2", "--interval-ms", "50"])
        .args(fixture_args("rx7900xtx"))
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 2, "{text}");
    let v: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(v["gpus"][0]["gpu_util_pct"], 87.0);
    assert_eq!(v["processes"][0]["pid"], 4242);
}
