//! The doctor's answer in one line: does GPU inference work here, and if not, what runs models
//! (the CPU) and the next step for each vendor. `hipscope top` says the same line when it finds
//! no GPU. The steps come from the facts: which runtime libraries load, whether `/dev/kfd` is
//! there and opens.

use serde::Serialize;

use super::facts::{Access, Facts};
use super::report::{Report, Status};

/// What telemetry not finding a GPU means.
pub const NO_GPU: &str = "no GPU found (no amdgpu card in sysfs, no NVML)";

/// What the verdict is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A GPU opened and every functional check passed: models run on it.
    Gpu,
    /// A GPU opened but a check failed: its results cannot be trusted.
    GpuFailing,
    /// No GPU can run models here: they run on the CPU.
    Cpu,
    /// Not checked (`--no-functional`, or a captured tree): only what the files show.
    Unchecked,
}

/// One vendor's next step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Step {
    pub vendor: &'static str,
    pub step: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    pub outcome: Outcome,
    /// What runs models here: `gpu` or `cpu` (`unknown` when not checked).
    pub runs_on: &'static str,
    /// The one line, as printed.
    pub summary: String,
    /// The next step for each vendor (when no GPU is usable).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub next: Vec<Step>,
}

impl Verdict {
    /// `--require-gpu`: the exit code is 1 unless GPU inference works.
    pub fn gpu_works(&self) -> bool {
        self.outcome == Outcome::Gpu
    }
}

fn library<'a>(f: &'a Facts, name: &str) -> Option<&'a super::facts::Library> {
    f.libraries.iter().find(|l| l.name == name)
}

/// Whether the library named so loaded; `None` when libraries were not probed.
fn loads(f: &Facts, name: &str) -> Option<bool> {
    library(f, name).map(|l| l.found.is_some())
}

/// The next step for an AMD GPU and for an NVIDIA one, from what the facts show.
pub fn next_steps(f: &Facts) -> Vec<Step> {
    let mut amd = Vec::new();
    match &f.dev_kfd {
        Some(Access::Missing) | None if !f.has_amd() => amd.push(
            "load the amdgpu driver (/dev/kfd is missing; in a container pass --device /dev/kfd \
             --device /dev/dri)"
                .to_string(),
        ),
        Some(Access::Denied) => amd.push(
            "join the render and video groups (/dev/kfd: permission denied): usermod -aG \
             render,video $USER, then log in again"
                .to_string(),
        ),
        _ => {}
    }
    match (loads(f, "HIP"), loads(f, "hiprtc")) {
        (Some(false), _) => {
            amd.push("install ROCm's HIP runtime (libamdhip64 and hiprtc, ROCm 5 to 7)".into())
        }
        (_, Some(false)) => amd.push("install ROCm's hiprtc (libhiprtc)".into()),
        (None, _) if f.libraries.is_empty() => {
            amd.push("have ROCm's HIP runtime (libamdhip64, hiprtc)".into())
        }
        _ => {}
    }
    if amd.is_empty() {
        amd.push("an AMD GPU is there but does not open: see the checks above".into());
    }
    let mut nvidia = Vec::new();
    match (loads(f, "CUDA driver"), loads(f, "nvrtc")) {
        (Some(false), nvrtc) => nvidia.push(format!(
            "install the NVIDIA driver (libcuda.so.1 not found){}",
            if nvrtc == Some(false) {
                " and CUDA's nvrtc"
            } else {
                ""
            }
        )),
        (Some(true), Some(false)) => {
            nvidia.push("install CUDA's nvrtc (libnvrtc.so.12 or .13)".into())
        }
        (Some(true), _) => nvidia.push(
            "the driver loads but shows no GPU: check nvidia-smi (in a container, --gpus all)"
                .into(),
        ),
        (None, _) => nvidia.push("have the NVIDIA driver (libcuda) and CUDA's nvrtc".into()),
    }
    vec![
        Step {
            vendor: "AMD",
            step: amd.join(", and "),
        },
        Step {
            vendor: "NVIDIA",
            step: nvidia.join(", and "),
        },
    ]
}

/// The line for a machine where no GPU can run models (`why` says what was found).
pub fn cpu_only(f: &Facts, why: &str) -> Verdict {
    let next = next_steps(f);
    let steps: Vec<String> = next
        .iter()
        .map(|s| format!("for {}: {}", s.vendor, s.step))
        .collect();
    Verdict {
        outcome: Outcome::Cpu,
        runs_on: "cpu",
        summary: format!(
            "{why}: models run on the CPU here. Next step {}",
            steps.join("; ")
        ),
        next,
    }
}

/// The doctor's verdict from its facts and its report. `functional`: whether the functional
/// checks ran (not with `--no-functional` or on a captured tree).
pub fn decide(f: &Facts, report: &Report, functional: bool) -> Verdict {
    let opened = report
        .checks
        .iter()
        .find(|c| c.section == "functional" && c.name == "device opens, kernels compile");
    let failed = report.count(Status::Fail);
    if !functional {
        if f.gpus.is_empty() {
            return cpu_only(f, NO_GPU);
        }
        return Verdict {
            outcome: Outcome::Unchecked,
            runs_on: "unknown",
            summary: format!(
                "{} GPU{} found, not tried (no functional checks): run `hipscope doctor` on the \
                 machine itself to know whether inference works",
                f.gpus.len(),
                if f.gpus.len() == 1 { "" } else { "s" }
            ),
            next: Vec::new(),
        };
    }
    match opened {
        Some(c) if c.status == Status::Pass && failed == 0 => Verdict {
            outcome: Outcome::Gpu,
            runs_on: "gpu",
            summary: format!("GPU inference works here: {}", c.detail),
            next: Vec::new(),
        },
        Some(c) if c.status == Status::Pass => Verdict {
            outcome: Outcome::GpuFailing,
            runs_on: "gpu",
            summary: format!(
                "the GPU opens ({}) but {failed} check{} failed: do not trust its answers until \
                 they pass (`--backend cpu` runs models on the CPU meanwhile)",
                c.detail,
                if failed == 1 { "" } else { "s" }
            ),
            next: Vec::new(),
        },
        Some(_) => cpu_only(
            f,
            "a GPU is there but its runtime cannot open it (see [functional])",
        ),
        None if f.gpus.is_empty() => cpu_only(f, NO_GPU),
        None => cpu_only(f, "no GPU opens"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::facts::Library;
    use super::super::report::Check;
    use super::*;

    fn lib(name: &'static str, found: bool) -> Library {
        Library {
            name,
            found: found.then(|| (format!("{name}.so"), None)),
        }
    }

    /// This machine's shape: HIP loads (Debian's ROCm 5), no /dev/kfd, no CUDA.
    fn no_gpu_facts() -> Facts {
        Facts {
            libraries: vec![
                lib("HIP", true),
                lib("hiprtc", true),
                lib("CUDA driver", false),
                lib("nvrtc", false),
            ],
            dev_kfd: Some(Access::Missing),
            ..Facts::default()
        }
    }

    #[test]
    fn no_gpu_says_the_cpu_runs_and_a_step_for_each_vendor() {
        let mut r = Report::default();
        r.push(Check::new("functional", "device", Status::Skip, "no GPU"));
        let v = decide(&no_gpu_facts(), &r, true);
        assert_eq!(
            (v.outcome, v.runs_on, v.gpu_works()),
            (Outcome::Cpu, "cpu", false)
        );
        assert!(!v.summary.contains('\n'), "one line: {}", v.summary);
        assert!(v.summary.contains("models run on the CPU"), "{}", v.summary);
        assert!(
            v.summary.contains("for AMD: load the amdgpu driver"),
            "{}",
            v.summary
        );
        assert!(
            v.summary.contains(
                "for NVIDIA: install the NVIDIA driver (libcuda.so.1 not found) and CUDA's nvrtc"
            ),
            "{}",
            v.summary
        );
        // HIP loads here, so installing it is not the step.
        assert!(!v.summary.contains("install ROCm"), "{}", v.summary);
    }

    #[test]
    fn steps_follow_what_is_missing() {
        let mut f = no_gpu_facts();
        f.libraries = vec![
            lib("HIP", false),
            lib("hiprtc", false),
            lib("CUDA driver", true),
            lib("nvrtc", false),
        ];
        f.dev_kfd = Some(Access::Denied);
        let s = next_steps(&f);
        assert!(
            s[0].step.contains("render and video groups"),
            "{}",
            s[0].step
        );
        assert!(
            s[0].step.contains("install ROCm's HIP runtime"),
            "{}",
            s[0].step
        );
        assert_eq!(s[1].step, "install CUDA's nvrtc (libnvrtc.so.12 or .13)");
        // Nothing probed (top, a captured tree): what each vendor needs, in general.
        let s = next_steps(&Facts::default());
        assert!(s[0].step.contains("amdgpu driver") && s[0].step.contains("HIP runtime"));
        assert!(s[1].step.contains("NVIDIA driver"));
    }

    #[test]
    fn a_gpu_that_opens_works_unless_a_check_failed() {
        let mut r = Report::default();
        r.push(Check::new(
            "functional",
            "device opens, kernels compile",
            Status::Pass,
            "NVIDIA H100 (sm_90)",
        ));
        let v = decide(&no_gpu_facts(), &r, true);
        assert!(v.gpu_works(), "{v:?}");
        assert!(v.summary.contains("H100"));
        r.push(Check::new("functional", "gemm", Status::Fail, "wrong"));
        let v = decide(&no_gpu_facts(), &r, true);
        assert_eq!(v.outcome, Outcome::GpuFailing);
        assert!(!v.gpu_works());
    }
}
