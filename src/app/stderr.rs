//! Standard error for the app's messages, progress lines and timings. A write that fails
//! (stderr closed: `2>&-`, or its reader gone: `2> >(head -c 1)`) is dropped, where `eprintln!`
//! would panic (exit code 101): a closed stderr is treated as a closed stdout is
//! (`cmd/usage.rs`), never as an error of the command, which goes on with its real work (its
//! output on stdout, its files) and ends with its own exit code. Every message of the app goes
//! through here; a test below keeps `eprintln!` out of `src/`.

use std::io::Write;

/// Writes `args` to stderr, dropping it if stderr cannot take it.
pub fn write_err(args: std::fmt::Arguments) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_fmt(args).and_then(|()| e.flush());
}

/// `eprintln!` that never panics.
macro_rules! errln {
    () => { $crate::app::stderr::write_err(format_args!("\n")) };
    ($($t:tt)*) => {
        $crate::app::stderr::write_err(format_args!("{}\n", format_args!($($t)*)))
    };
}

/// `eprint!` that never panics.
macro_rules! err {
    ($($t:tt)*) => { $crate::app::stderr::write_err(format_args!($($t)*)) };
}

pub(crate) use {err, errln};

#[cfg(test)]
mod tests {
    /// `eprintln!` and `eprint!` panic on a closed stderr: none in the program's sources.
    #[test]
    fn no_panicking_stderr_macro_in_the_sources() {
        fn walk(dir: &std::path::Path, found: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, found);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    for (i, line) in text.lines().enumerate() {
                        let code = line.split("//").next().unwrap_or_default();
                        let needles = [concat!("eprint", "ln!("), concat!("eprint", "!(")];
                        if needles.iter().any(|n| code.contains(n)) {
                            found.push(format!("{}:{}", p.display(), i + 1));
                        }
                    }
                }
            }
        }
        let mut found = Vec::new();
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut found,
        );
        assert!(
            found.is_empty(),
            "use errln!/err! (app/stderr.rs): {found:#?}"
        );
    }
}
